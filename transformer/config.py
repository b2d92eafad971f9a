"""Typed settings, one dataclass per Hydra config group.

`configs/<group>/*.yaml` mirror these dataclasses one-to-one. Hydra composes them only
at the entry points (`train.py`, `translate.py`, `evaluate.py`); everything else
receives these plain objects, so a test or a notebook can write `ModelConfig(...)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf


@dataclass
class ModelConfig:
    """The Transformer of Vaswani et al. (2017); defaults are the paper's base model."""

    vocab_size: int = 8000
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    dropout: float = 0.1  # on each sublayer's output before the residual add, and on embeddings+positions
    attn_dropout: float = 0.1  # on the attention weights
    ffn_dropout: float = 0.1  # on the FFN's inner ReLU activations (fairseq's activation_dropout)
    max_len: int = 1024  # longest sequence the sinusoidal table covers
    pre_norm: bool = False  # the paper is post-norm: LayerNorm(x + Sublayer(x))
    tie_embeddings: bool = True  # the paper's three-way tying: src emb = tgt emb = output proj
    pad_id: int = 0
    bos_id: int = 2
    eos_id: int = 3


@dataclass
class DataConfig:
    """Which corpus, how it is cleaned, tokenized and batched."""

    name: str = "tatoeba"  # tatoeba | iwslt2017 | opus100 | files | sample
    root: str = "../shared/data"  # relative paths resolve against the project root
    src_lang: str = "it"
    tgt_lang: str = "en"
    # data=files: plain-text pair (train_src/train_tgt), or one TSV / JSONL in train_src
    train_src: str | None = None
    train_tgt: str | None = None
    dev_src: str | None = None
    dev_tgt: str | None = None
    # data=iwslt2017 / opus100: hub id, config and revision (or a local parquet folder)
    hub_id: str | None = None
    hub_config: str | None = None
    hub_revision: str | None = None
    hub_local_dir: str | None = None  # parquet files laid out as on the hub (tests, mirrors)
    # cleaning
    max_len: int = 128  # tokens per side after SentencePiece; longer pairs are dropped
    max_len_ratio: float = 3.0  # drop pairs whose token-length ratio exceeds this
    max_train_pairs: int | None = None  # keep only the first N training pairs (debugging)
    # vocabulary
    vocab_size: int = 8000
    spm_model_type: str = "unigram"  # unigram | bpe
    spm_character_coverage: float = 1.0
    spm_input_sentence_size: int = 1_000_000
    # batching
    max_tokens: int = 4096  # padded tokens per batch and side (fairseq --max-tokens)
    bucket_chunk: int = 100  # batches' worth of examples sorted together before shuffling
    num_proc: int = 2  # processes for datasets.map
    cache_dir: str = "data/cache"  # tokenizers and encoded corpora (git-ignored)


@dataclass
class OptimConfig:
    """Adam with the paper's inverse-square-root warm-up schedule."""

    lr: float = 7e-4  # peak learning rate, reached at the end of warm-up
    warmup_steps: int = 4000
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-9
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    clip_norm: float = 1.0  # 0 disables clipping
    fused: bool = True  # fused AdamW kernel on CUDA (ignored on CPU)


@dataclass
class TrainerConfig:
    """The training loop: length, precision, validation, checkpoints, logging."""

    max_steps: int = 100_000  # optimizer updates
    max_epochs: int | None = None
    max_hours: float | None = None  # stop after this much training time (fairseq --stop-time-hours)
    accum_steps: int = 1  # gradient accumulation
    precision: str = "fp32"  # fp32 | bf16 | fp16
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    compile: bool = False  # torch.compile the model
    seed: int = 1
    run_dir: str = "runs/default"
    resume: str = "auto"  # auto | never | <checkpoint dir>
    log_every: int = 50
    val_every: int = 1000
    val_bleu_sentences: int | None = 500  # dev sentences (evenly spaced; null: all) decoded greedily at each validation
    val_max_tokens: int = 6000
    keep_last: int = 3
    patience: int | None = None  # validations without a better dev BLEU before stopping
    save_every: int | None = None  # default: at every validation
    num_threads: int | None = None  # torch.set_num_threads on CPU
    progress: bool = True


@dataclass
class DecodeConfig:
    """Search settings for translate, evaluate and validation."""

    method: str = "beam"  # greedy | beam
    beam_size: int = 5
    lenpen: float = 0.6  # GNMT length penalty alpha: ((5 + |y|) / 6) ** alpha
    nbest: int = 1
    max_len_a: float = 1.2  # hypotheses stop at a * |x| + b tokens
    max_len_b: int = 10
    min_len: int = 1
    max_tokens: int | None = None  # source tokens per decoding batch; None: 8000 on CUDA, 2000 on CPU
    precision: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | fp32 | bf16


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    decode: DecodeConfig = field(default_factory=lambda: DecodeConfig(method="greedy"))


T = TypeVar("T")


def to_dataclass(schema: type[T], cfg: DictConfig | dict[str, Any]) -> T:
    """Validate a composed config against its dataclass and return the typed object.

    Unknown keys and values of the wrong type raise an error that names the key.
    """
    merged = OmegaConf.merge(OmegaConf.structured(schema), cfg)
    return OmegaConf.to_object(merged)  # type: ignore[return-value]
