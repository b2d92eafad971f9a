"""Typed settings, one dataclass per Hydra config group, with their valid ranges.

Each setting's default and help text live here, once: the default in the field, the help
in the docstring below it, which `mt-* --help` prints (`transformer/commands/help.py`) and
the API reference shows. `configs/<group>/*.yaml` mirror these
dataclasses one-to-one: the entry points (`transformer/commands/cli.py`) register each
dataclass with Hydra as its group's schema, and a preset holds only what it changes.
Hydra composes them only at the entry points; everything else receives these plain
objects, so a test or a notebook can write `ModelConfig(...)`.
`to_dataclass` checks types (OmegaConf) and ranges (each class's `validate`), so a bad
setting is refused, naming its key, before any work starts.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import re
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from transformer.bounds import (
    MAX_BATCH_TOKENS,
    MAX_BEAM_SIZE,
    MAX_NBEST,
    MAX_NO_REPEAT_NGRAM,
    MAX_POSITIONS,
    MAX_SEGMENTATIONS,
    MAX_SYNC_EVERY,
    worker_limit,
)
from transformer.errors import ConfigError

log = logging.getLogger(__name__)

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune")  # decode.compile
MAX_PAD_TO_MULTIPLE = 64  # data.pad_to_multiple: beyond it padding costs more than shapes save
MAX_PREFETCH_BATCHES = 64  # data.prefetch_batches: batches held in host memory
CORPORA = ("tatoeba", "europarl", "iwslt2017", "opus100", "sample", "files")  # data.name, or mix


def require(ok: bool, key: str, value: Any, rule: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r}: {rule}")


def positive(key: str, value: float | None, optional: bool = False, minimum: float = 1) -> None:
    if value is None and optional:
        return
    rule = f"must be >= {minimum}" + (" (or null)" if optional else "")
    require(value is not None and value >= minimum, key, value, rule)


def _at_most(key: str, value: float, bound: float) -> None:
    require(value <= bound, key, value, f"must be <= {bound} (transformer/bounds.py)")


_deprecations_told: set[str] = set()


def _deprecated(old: str, new: str) -> None:
    """One warning a process that the key `old` is now `new`."""
    if old not in _deprecations_told:
        _deprecations_told.add(old)
        log.warning("%s is deprecated: it is now %s", old, new)


def at_most_workers(key: str, value: int | None) -> None:
    """Worker processes or threads: at most the CPU cores this process may use (at least 2)."""
    limit = worker_limit()
    require(value is None or value <= limit, key, value,
            f"must be <= {limit}, the CPU cores this process may use (at least 2)")


def _fraction(key: str, value: float) -> None:
    require(0.0 <= value < 1.0, key, value, "must be in [0, 1)")


@dataclass
class ModelConfig:
    """The Transformer of Vaswani et al. (2017); defaults are the paper's base model."""

    vocab_size: int = 8000
    """Pieces of the vocabulary; a training run sets it from its tokenizer."""
    d_model: int = 512
    """Width of the embeddings and of every sublayer's output."""
    n_heads: int = 8
    """Attention heads; must divide d_model."""
    d_ff: int = 2048
    """Inner width of each position-wise feed-forward network."""
    n_encoder_layers: int = 6
    """Encoder layers (N in the paper)."""
    n_decoder_layers: int = 6
    """Decoder layers."""
    dropout: float = 0.1
    """Dropout on each sublayer's output before the residual add, and on embeddings plus
    positions."""
    attn_dropout: float = 0.1
    """Dropout on the attention weights."""
    ffn_dropout: float = 0.1
    """Dropout on the feed-forward network's inner ReLU activations (fairseq's
    activation_dropout)."""
    max_positions: int = 1024
    """Rows of the sinusoidal position table: the longest sequence, BOS/EOS included."""
    pre_norm: bool = False
    """LayerNorm before each sublayer; false: the paper's post-norm, LayerNorm(x + Sublayer(x))."""
    tie_embeddings: bool = True
    """The paper's three-way tying: source embedding = target embedding = output projection."""
    pad_id: int = 0
    """Id of the padding token; a training run sets it from its tokenizer."""
    bos_id: int = 2
    """Id of the token that begins each decoder input."""
    eos_id: int = 3
    """Id of the end-of-sequence token, which ends each target, and decoding."""

    def validate(self, prefix: str = "model") -> None:
        for name in ("vocab_size", "d_model", "n_heads", "d_ff", "n_encoder_layers",
                     "n_decoder_layers"):
            positive(f"{prefix}.{name}", getattr(self, name))
        require(self.d_model % self.n_heads == 0, f"{prefix}.n_heads", self.n_heads,
                f"must divide {prefix}.d_model={self.d_model}")
        for name in ("dropout", "attn_dropout", "ffn_dropout"):
            _fraction(f"{prefix}.{name}", getattr(self, name))
        positive(f"{prefix}.max_positions", self.max_positions, minimum=2)
        _at_most(f"{prefix}.max_positions", self.max_positions, MAX_POSITIONS)
        ids = {"pad_id": self.pad_id, "bos_id": self.bos_id, "eos_id": self.eos_id}
        for name, value in ids.items():
            require(0 <= value < self.vocab_size, f"{prefix}.{name}", value,
                    f"must be a token id below {prefix}.vocab_size={self.vocab_size}")
        require(len(set(ids.values())) == 3, f"{prefix}.eos_id", self.eos_id,
                "pad_id, bos_id and eos_id must be three different ids")


    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> ModelConfig:
        """A ModelConfig from a checkpoint's model.json, also one that names a key by its
        old name (`max_len` for `max_positions`)."""
        saved = dict(saved)
        if "max_len" in saved and "max_positions" not in saved:
            saved["max_positions"] = saved.pop("max_len")
        return cls(**saved)


@dataclass
class PhaseConfig:
    """A phase of a mix's schedule (`data.phases`): how many epochs it lasts and the corpus
    weights its epochs draw with; a corpus it leaves out draws nothing."""

    epochs: int = 1
    """Epochs the phase lasts; 0 skips it (a search can turn the phase off)."""
    corpora: dict[str, float] = field(default_factory=dict)
    """The weights its epochs draw with, e.g. {tatoeba: 1}."""


DEDUP_MODES = ("pairs", "target")  # data.filters.dedup


@dataclass
class FilterConfig:
    """Filters of the training pairs, applied at preparation after cleaning, in the order
    below (a pair is counted under the first that drops it); dev and test sets are never
    filtered. All off by default."""

    char_ratio: float | None = None
    """Drop pairs whose longer side has more than this many times the characters of the
    shorter, e.g. 3; null: off."""
    numbers: bool = False
    """Drop pairs whose numbers differ: the two sides' sets of digit runs (so 1.000 and
    1,000 agree) differ by more numbers than they share (OpusCleaner's num_mismatch)."""
    script: float | None = None
    """Drop pairs with more than this share of their letters outside the Latin script on
    either side, e.g. 0.1; null: off."""
    langid: float | None = None
    """Language identification (py3langid: pip install 'transformer-mt[filters]'): drop
    a pair when the probability that a side is in its language (src_lang, tgt_lang) is
    below this, e.g. 0.01 (short sentences score low: see docs/data.md); null: off."""
    dedup: str | None = None
    """Duplicates: `pairs` drops a pair identical to an earlier one, `target` a pair whose
    target an earlier pair has (its source a paraphrase); null: off."""

    def validate(self, prefix: str = "data.filters") -> None:
        if self.char_ratio is not None:
            require(self.char_ratio >= 1, f"{prefix}.char_ratio", self.char_ratio, "must be >= 1 (or null)")
        if self.script is not None:
            _fraction(f"{prefix}.script", self.script)
        if self.langid is not None:
            _fraction(f"{prefix}.langid", self.langid)
            require(importlib.util.find_spec("py3langid") is not None, f"{prefix}.langid", self.langid,
                    "needs py3langid: pip install 'transformer-mt[filters]'")
        require(self.dedup in (None, *DEDUP_MODES), f"{prefix}.dedup", self.dedup,
                f"choose {' or '.join(DEDUP_MODES)} (or null)")

    def active(self) -> bool:
        """Whether any filter is on."""
        return any(v is not None and v is not False for v in asdict(self).values())  # script=0 is on


@dataclass
class AugmentConfig:
    """Training pairs changed on the fly as people type (after OpusTrainer's modifiers):
    each setting is the probability that a training pair gets that change, drawn anew
    each epoch from trainer.seed, the epoch and the pair; a pair may get several. 0 (the
    default) turns a change off. Dev and test sets are never changed (docs/robustness.md)."""

    upper: float = 0.0
    """Both sides upper-cased."""
    title: float = 0.0
    """Both sides title-cased: each word's first letter upper-cased (upper wins when both are drawn)."""
    nopunct: float = 0.0
    """Both sides without their final punctuation (. ! ? … ; : ,)."""
    typos: float = 0.0
    """Typos in the source only: letters swapped with the next, dropped or repeated, one
    per 40 characters (at least one a line)."""
    merge: float = 0.0
    """The pair joined with another pair of its batch, each side with a space (the other
    pair is also trained on alone)."""

    @property
    def active(self) -> bool:
        """Whether any change is on."""
        return any(getattr(self, f.name) > 0 for f in fields(self))

    def validate(self, prefix: str = "data.augment") -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            require(0.0 <= value <= 1.0, f"{prefix}.{f.name}", value, "a probability must be in [0, 1]")


@dataclass
class SubwordSamplingConfig:
    """Subword regularisation of the training pairs (`data.subword_sampling`): SentencePiece's
    sampling (Kudo 2018) for a unigram model, BPE-dropout (Provilkov et al. 2020) for a BPE
    one. Preparation keeps `segmentations` sampled segmentations of each training sentence in
    the cache; each epoch takes another of them. Dev and test sets are never sampled."""

    alpha: float = 0.0
    """0: off (every epoch sees the one best segmentation). Unigram: the smoothing exponent
    of the sampling distribution (SentencePiece's alpha; 0.1 with nbest 64 in Kudo 2018;
    smaller is closer to uniform); BPE: the probability of dropping each merge."""
    nbest: int = 64
    """Unigram: sample among the nbest best segmentations; -1: over all of them (the whole
    lattice, faster). Ignored by a BPE model."""
    segmentations: int = 4
    """Sampled segmentations kept per training sentence (each costs preparation time, and
    memory: a copy of the sampled side's ids); epoch e takes one, and a sentence goes
    through all of them before it sees one again."""
    target: bool = False
    """Sample the target side too; false: the source only."""

    @property
    def on(self) -> bool:
        """Whether training pairs are sampled at all."""
        return self.alpha > 0

    def validate(self, prefix: str = "data.subword_sampling") -> None:
        require(0 <= self.alpha <= 1, f"{prefix}.alpha", self.alpha, "must be in [0, 1] (0: off)")
        require(self.nbest == -1 or self.nbest >= 2, f"{prefix}.nbest", self.nbest,
                "must be >= 2, or -1 (sample over all segmentations)")
        _at_most(f"{prefix}.nbest", self.nbest, MAX_NBEST)
        positive(f"{prefix}.segmentations", self.segmentations, minimum=2)
        _at_most(f"{prefix}.segmentations", self.segmentations, MAX_SEGMENTATIONS)


@dataclass
class DataConfig:
    """Which corpus, how it is cleaned, tokenized and batched.

    The project's folders, `root` and `cache_dir`, resolve against the project root; the
    user's files (`train_src` ... `hub_local_dir`, `tokenizer`) against the working directory.
    """

    name: str = "tatoeba"
    """The corpus: tatoeba | europarl | iwslt2017 | opus100 | files (your own) | sample | mix."""
    corpora: dict[str, float] = field(default_factory=dict)
    """name=mix: the corpora trained on together, each with its weight, the share of
    training pairs drawn from it (a small corpus is upsampled), e.g. {tatoeba: 1, europarl: 1};
    `files` is the pairs of train_src (and dev_src), e.g. back-translations."""
    phases: list[PhaseConfig] = field(default_factory=list)
    """name=mix: the first epochs' own weights, in order, e.g. a Tatoeba-first phase
    [{epochs: 2, corpora: {tatoeba: 1}}]; `corpora` hold after the last."""
    epoch_pairs: int | None = None
    """name=mix: training pairs per epoch (fairseq's --virtual-epoch-size), the unit of
    `phases` and trainer.max_epochs; null: all the corpora's pairs."""
    root: str = "../shared/data"
    """Where the named corpora lie (relative: to the project root); test sets in {root}/eval."""
    src_lang: str = "it"
    """Source language code (the side translated from): a named corpus's files end in it
    (train.it), as do the test sets'; src_lang=en tgt_lang=it trains English→Italian."""
    tgt_lang: str = "en"
    """Target language code (the side translated to)."""
    train_src: str | None = None
    """data=files: the training source file of a line-aligned plain-text pair, or one TSV
    (src<TAB>tgt) or JSONL file holding both sides."""
    train_tgt: str | None = None
    """data=files: the training target file of a plain-text pair; null: train_src is TSV or JSONL."""
    dev_src: str | None = None
    """data=files: the dev set, as train_src; null: the last 2% of train (at most 2,000 pairs)."""
    dev_tgt: str | None = None
    """data=files: the dev set's target file (a plain-text pair)."""
    hub_id: str | None = None
    """data=iwslt2017 / opus100: the dataset's id on the Hugging Face hub."""
    hub_config: str | None = None
    """The hub dataset's configuration (its language pair)."""
    hub_revision: str | None = None
    """A branch, tag or commit of the hub dataset."""
    hub_local_dir: str | None = None
    """Parquet files laid out as on the hub (a mirror), read instead of the hub."""
    max_len: int = 128
    """Tokens per side after SentencePiece; longer training pairs are dropped."""
    max_len_ratio: float = 3.0
    """Training pairs whose token-length ratio exceeds this are dropped."""
    max_train_pairs: int | None = None
    """Keep only the first N training pairs (debugging); null: all."""
    filters: FilterConfig = field(default_factory=FilterConfig)
    """Filters of the training pairs (language, duplicates, numbers, scripts, length
    ratio), all off by default: see data.filters.*."""
    tokenizer: str | None = None
    """An existing SentencePiece model (a .model file, or a checkpoint directory's
    tokenizer.model) to encode with instead of training one (the spm_* settings are then
    unused); a fine-tuning run (trainer.init_from) uses its checkpoint's."""
    spm_vocab_size: int = 8000
    """Pieces of the joint SentencePiece vocabulary trained on the corpus (the model's
    vocab_size is then the tokenizer's)."""
    spm_model_type: str = "unigram"
    """The SentencePiece algorithm: unigram | bpe."""
    spm_character_coverage: float = 1.0
    """SentencePiece's character_coverage: 1.0 keeps every character."""
    spm_input_sentence_size: int = 1_000_000
    """At most this many sentences (a seeded sample) train the vocabulary."""
    spm_case_copies: float = 0.0
    """Cased copies in the vocabulary's training text: each sentence adds an upper-cased
    copy with this probability and a title-cased one with this probability (seeded), so
    that text typed in capitals has pieces of its own rather than single letters; for
    data.augment's upper and title. 0: off (docs/robustness.md)."""
    max_tokens: int = 4096
    """Padded tokens per training batch and side (fairseq's --max-tokens)."""
    bucket_chunk: int = 100
    """Batches' worth of examples sorted by length together before the batches are shuffled."""
    num_proc: int = 2
    """Preparation's worker processes that clean and encode chunks (SentencePiece threads
    for a small corpus)."""
    cache_dir: str = "data/cache"
    """Where tokenizers and encoded corpora are kept (relative: to the project root)."""
    pad_to_multiple: int | None = None
    """Pad a training batch's lengths up to a multiple of this; null: 8 on a GPU (few
    distinct shapes for trainer.compile, tensor-core-sized products), 1 on a CPU (where
    padding is compute)."""
    prefetch_batches: int = 4
    """Training batches a background thread collates ahead (held in host memory)."""
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    """Training pairs changed on the fly as people type (upper case, title case, no final
    punctuation, typos, merged pairs), e.g. {upper: 0.1, title: 0.1}: off by default."""
    subword_sampling: SubwordSamplingConfig = field(default_factory=SubwordSamplingConfig)
    """Subword sampling or BPE-dropout of the training pairs, e.g. {alpha: 0.1, nbest: 64};
    alpha 0 (the default): off."""

    def validate(self, prefix: str = "data") -> None:
        names = (*CORPORA, "mix")
        require(self.name in names, f"{prefix}.name", self.name, f"choose one of {', '.join(names)}")
        if self.name == "mix":
            require(bool(self.corpora), f"{prefix}.corpora", self.corpora,
                    "name=mix needs corpora to mix, e.g. {tatoeba: 1, europarl: 1}")
            for corpus, weight in self.corpora.items():
                require(corpus in CORPORA, f"{prefix}.corpora", corpus,
                        f"can mix the corpora {', '.join(CORPORA)}")
                require(weight > 0, f"{prefix}.corpora.{corpus}", weight, "a weight must be > 0")
            require("files" not in self.corpora or bool(self.train_src), f"{prefix}.train_src",
                    self.train_src, "a mix with files needs its training pairs (train_src)")
            self._validate_phases(prefix)
        else:
            mix_only = {"corpora": dict(self.corpora), "phases": [asdict(p) for p in self.phases],
                        "epoch_pairs": self.epoch_pairs}
            for name, value in mix_only.items():
                require(value in (None, {}, []), f"{prefix}.{name}", value, f"only for {prefix}.name=mix")
        require(self.src_lang != self.tgt_lang, f"{prefix}.tgt_lang", self.tgt_lang,
                f"must differ from {prefix}.src_lang")
        positive(f"{prefix}.max_len", self.max_len)
        _at_most(f"{prefix}.max_len", self.max_len, MAX_POSITIONS)
        positive(f"{prefix}.max_len_ratio", self.max_len_ratio)
        positive(f"{prefix}.max_train_pairs", self.max_train_pairs, optional=True)
        self.filters.validate(f"{prefix}.filters")
        positive(f"{prefix}.spm_vocab_size", self.spm_vocab_size, minimum=5)  # 4 special pieces + 1
        require(self.spm_model_type in ("unigram", "bpe"), f"{prefix}.spm_model_type",
                self.spm_model_type, "choose unigram or bpe")
        require(0 < self.spm_character_coverage <= 1, f"{prefix}.spm_character_coverage",
                self.spm_character_coverage, "must be in (0, 1]")
        positive(f"{prefix}.spm_input_sentence_size", self.spm_input_sentence_size)
        _fraction(f"{prefix}.spm_case_copies", self.spm_case_copies)
        require(self.max_tokens > self.max_len, f"{prefix}.max_tokens", self.max_tokens,
                f"a batch must hold the longest pair: more than {prefix}.max_len={self.max_len}")
        _at_most(f"{prefix}.max_tokens", self.max_tokens, MAX_BATCH_TOKENS)
        positive(f"{prefix}.bucket_chunk", self.bucket_chunk)
        positive(f"{prefix}.num_proc", self.num_proc)
        at_most_workers(f"{prefix}.num_proc", self.num_proc)
        positive(f"{prefix}.pad_to_multiple", self.pad_to_multiple, optional=True)
        _at_most(f"{prefix}.pad_to_multiple", self.pad_to_multiple or 1, MAX_PAD_TO_MULTIPLE)
        if self.pad_to_multiple:  # the longest pair, with its target's BOS/EOS (batching.TGT_EXTRA), padded
            multiple = self.pad_to_multiple
            padded = -(-(self.max_len + 1) // multiple) * multiple
            require(padded <= self.max_tokens, f"{prefix}.pad_to_multiple", multiple,
                    f"pads the longest pair ({prefix}.max_len={self.max_len}, +1 for BOS/EOS) to {padded} "
                    f"tokens, more than {prefix}.max_tokens={self.max_tokens}: lower it or raise "
                    f"{prefix}.max_tokens")
        positive(f"{prefix}.prefetch_batches", self.prefetch_batches)
        _at_most(f"{prefix}.prefetch_batches", self.prefetch_batches, MAX_PREFETCH_BATCHES)
        self.augment.validate(f"{prefix}.augment")
        self.subword_sampling.validate(f"{prefix}.subword_sampling")

    def describe(self) -> str:
        """The corpus, or a mix's corpora and weights: `mix (tatoeba 1, europarl 2)`."""
        if self.name != "mix":
            return self.name
        return f"mix ({', '.join(f'{name} {weight:g}' for name, weight in self.corpora.items())})"

    def _validate_phases(self, prefix: str) -> None:
        positive(f"{prefix}.epoch_pairs", self.epoch_pairs, optional=True)
        mixed = ", ".join(self.corpora)
        for i, phase in enumerate(self.phases):
            key = f"{prefix}.phases[{i}]"
            positive(f"{key}.epochs", phase.epochs, minimum=0)
            for corpus, weight in phase.corpora.items():
                require(corpus in self.corpora, f"{key}.corpora", corpus,
                        f"not a corpus of the mix ({prefix}.corpora: {mixed})")
                require(weight >= 0, f"{key}.corpora.{corpus}", weight, "a weight must be >= 0")
            require(sum(phase.corpora.values()) > 0, f"{key}.corpora", dict(phase.corpora),
                    "a phase needs a corpus with a weight > 0, e.g. {tatoeba: 1}")


@dataclass
class OptimConfig:
    """Adam with the paper's inverse-square-root warm-up schedule."""

    lr: float = 7e-4
    """Peak learning rate, reached at the end of the warm-up."""
    warmup_steps: int = 4000
    """Updates of linear warm-up; then the rate falls with the inverse square root of the step."""
    betas: tuple[float, float] = (0.9, 0.98)
    """Adam's beta1 and beta2 (the paper's)."""
    eps: float = 1e-9
    """Adam's epsilon (the paper's)."""
    weight_decay: float = 0.0
    """Decoupled (AdamW) weight decay."""
    label_smoothing: float = 0.1
    """The paper's label smoothing, epsilon_ls."""
    clip_norm: float = 1.0
    """Clip the gradients' global norm to this; 0: no clipping."""
    fused: bool = True
    """The fused AdamW kernel (CUDA and CPU); false: PyTorch's per-tensor loop."""

    def validate(self, prefix: str = "optim") -> None:
        require(self.lr > 0, f"{prefix}.lr", self.lr, "must be > 0")
        positive(f"{prefix}.warmup_steps", self.warmup_steps, minimum=0)
        require(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), f"{prefix}.betas",
                list(self.betas), "must be two numbers in [0, 1)")
        require(self.eps > 0, f"{prefix}.eps", self.eps, "must be > 0")
        positive(f"{prefix}.weight_decay", self.weight_decay, minimum=0)
        _fraction(f"{prefix}.label_smoothing", self.label_smoothing)
        positive(f"{prefix}.clip_norm", self.clip_norm, minimum=0)


@dataclass
class TrainerConfig:
    """The training loop: length, precision, validation, checkpoints, logging."""

    max_steps: int = 100_000
    """Stop after this many optimizer updates."""
    max_epochs: int | None = None
    """Stop after this many epochs too; null: no limit."""
    max_hours: float | None = None
    """Stop after this much training time, validation and checkpoints not counted
    (fairseq's --stop-time-hours); null: no limit."""
    accum_steps: int = 1
    """Batches whose gradients are accumulated into one update."""
    precision: str = "auto"
    """auto | fp32 | bf16 | fp16 (CUDA only); auto: bf16 on a GPU that has it (else fp16
    with loss scaling), bf16 on a CPU with native bf16 (AVX512-BF16, AMX), else fp32."""
    device: str = "auto"
    """auto | cpu | cuda | cuda:N; auto: a GPU if there is one (under torchrun, the
    process's own), else the CPU."""
    compile: bool | None = False
    """torch.compile the forward and the loss; null: on for CUDA, off elsewhere. Off by
    default: the first compiled update takes minutes to compile, on a GPU as on a CPU
    (docs/results/gpu.md, "The compiled training step")."""
    seed: int = 1
    """Random seed: initial weights, batch order, dropout."""
    run_dir: str = "runs/default"
    """Where checkpoints, logs and config.yaml go; mt-train makes it Hydra's output
    directory (a sweep gives each job a subdirectory)."""
    resume: str = "auto"
    """auto: continue the run in run_dir, if there is one | never | a checkpoint directory."""
    init_from: str | None = None
    """Fine-tuning: a new run from this checkpoint's weights, model config and tokenizer,
    with a fresh optimizer and schedule."""
    log_every: int = 50
    """Updates between training log lines."""
    val_every: int = 1000
    """Updates between validations (dev loss and BLEU; the best checkpoint is kept)."""
    val_bleu_sentences: int | None = 500
    """Dev sentences (evenly spaced) decoded greedily at each validation; null: all."""
    val_max_tokens: int = 6000
    """Padded tokens per dev-set batch at validation."""
    keep_last: int = 3
    """Step checkpoints kept (the newest); 0: all."""
    patience: int | None = None
    """Stop after this many validations without a better dev BLEU; null: never."""
    save_every: int | None = None
    """Updates between step checkpoints; null: at every validation."""
    num_threads: int | None = None
    """CPU threads (torch.set_num_threads); null: torch's default."""
    progress: bool = True
    """A progress bar on stderr; false: a log line every log_every updates instead."""
    diverge_after: int = 5
    """Skipped updates (inf/NaN loss or gradients) in a row before the run stops as
    diverged (in fp16, once the loss scale is below 1e-4); the last good checkpoint is kept."""
    # 0.5: the Europarl recipe under 3 GB in bf16 at the same speed as 1.0 (docs/results/memory.md,
    # "The heap slack and memory")
    heap_slack_gb: float | None = 0.5
    """CPU: free heap memory the process may keep before it is given back to the OS
    (glibc's malloc_trim; varied batch shapes leave holes it cannot reuse); null: never."""

    def validate(self, prefix: str = "trainer") -> None:
        for name in ("max_steps", "accum_steps", "log_every", "val_every", "val_max_tokens",
                     "diverge_after"):
            positive(f"{prefix}.{name}", getattr(self, name))
        _at_most(f"{prefix}.val_max_tokens", self.val_max_tokens, MAX_BATCH_TOKENS)
        for name in ("max_epochs", "val_bleu_sentences", "patience", "save_every", "num_threads"):
            positive(f"{prefix}.{name}", getattr(self, name), optional=True)
        for name in ("max_hours", "heap_slack_gb"):
            value = getattr(self, name)
            require(value is None or value > 0, f"{prefix}.{name}", value, "must be > 0 (or null)")
        require(self.precision in PRECISIONS, f"{prefix}.precision", self.precision,
                f"choose one of {', '.join(PRECISIONS)}")
        check_device(f"{prefix}.device", self.device)
        positive(f"{prefix}.seed", self.seed, minimum=0)
        require(bool(self.run_dir), f"{prefix}.run_dir", self.run_dir, "must name a directory")
        require(bool(self.resume), f"{prefix}.resume", self.resume,
                "auto, never, or a checkpoint directory")
        positive(f"{prefix}.keep_last", self.keep_last, minimum=0)
        at_most_workers(f"{prefix}.num_threads", self.num_threads)


@dataclass
class DecodeConfig:
    """Search settings for translate, evaluate and validation."""

    method: str = "beam"
    """The search: greedy | beam | sample (each token drawn from the model's distribution,
    shaped by the sampling_* settings and seeded by seed)."""
    beam_size: int = 5
    """Hypotheses kept at each step (method=beam only)."""
    lenpen: float = 0.6
    """GNMT length penalty alpha: score = sum log p / ((5 + |y|) / 6) ** alpha; for greedy
    search it only rescales the reported score."""
    nbest: int = 1
    """Hypotheses given per sentence (at most beam_size; greedy gives one)."""
    max_len_a: float = 1.2
    """Hypotheses stop at a * |x| + b tokens (|x|: the source's tokens): this is a."""
    max_len_b: int = 10
    """b of that length limit."""
    min_len: int = 1
    """EOS is forbidden before this many tokens."""
    batch_tokens: int | None = None
    """Source tokens per decoding batch, its sentences times the longest one's tokens (a
    beam batch holds beam_size hypotheses a sentence), also what a streamed window of input
    holds; null: 2000 on a CPU; on CUDA 8000, doubled up to 64000 as the free memory allows."""
    max_batch_size: int | None = None
    """Sentences per decoding batch, beside batch_tokens; null: as many as batch_tokens allows."""
    no_repeat_ngram_size: int = 0
    """A hypothesis never repeats an n-gram of this size of its own output; 0: off."""
    precision: str = "auto"
    """auto | fp32 | bf16 | fp16 (CUDA only); auto: fp32 on a CPU (as an export computes
    there, so a checkpoint and its fp32 export translate alike), bf16 on a GPU that has
    it, else fp16. An export computes in its own type: leave it auto."""
    split_sentences: bool = True
    """Split each line into sentences, translate them and join them again; false: lines
    are translated whole."""
    compile: str = "none"
    """The decoder step: none (eager) | default | reduce-overhead (CUDA graphs on a GPU) |
    max-autotune, a torch.compile mode; the first batch pays for compiling it."""
    sync_every: int | None = None
    """Decoder steps between the host's reads of how many sentences are still live (the
    finished ones leave then); null: 1 on a CPU, 4 on CUDA."""
    buckets: bool | None = None
    """Finished rows leave in powers of two (few shapes for a compiled step); null: on
    where the step is compiled on a GPU."""
    sampling_topk: int = 0
    """method=sample: draw from the k most probable tokens only; 0: no limit; 1: greedy."""
    sampling_topp: float = 1.0
    """method=sample: draw from the most probable tokens whose probabilities first reach
    this total (nucleus sampling), in (0, 1]; 1: no limit. Without sampling_topk each step
    sorts the whole vocabulary (slow on a CPU); with it, only the k best."""
    sampling_temperature: float = 1.0
    """method=sample: draw the kept tokens with probability softmax(log p / T); below 1
    sharper, above 1 flatter."""
    seed: int = 0
    """method=sample: the draws' seed; a sentence's translation depends on it and on its
    place in the input (line, sentence), not on the batch it is decoded in."""
    max_tokens: int | None = None
    """The old name of batch_tokens, still accepted: moved there with a warning."""

    def __post_init__(self) -> None:
        """An old `max_tokens` moves to `batch_tokens` (a one-line warning, once a process);
        both given with different values is refused, naming both."""
        if self.max_tokens is None:
            return
        positive("decode.max_tokens", self.max_tokens)  # named as typed, not as batch_tokens
        _at_most("decode.max_tokens", self.max_tokens, MAX_BATCH_TOKENS)
        require(self.batch_tokens in (None, self.max_tokens), "decode.max_tokens", self.max_tokens,
                f"the old name of decode.batch_tokens, which holds {self.batch_tokens}: set "
                "decode.batch_tokens alone")
        _deprecated("decode.max_tokens", "decode.batch_tokens (source tokens per decoding batch)")
        self.batch_tokens, self.max_tokens = self.max_tokens, None

    def validate(self, prefix: str = "decode") -> None:
        require(self.method in ("greedy", "beam", "sample"), f"{prefix}.method", self.method,
                "choose greedy, beam or sample")
        positive(f"{prefix}.beam_size", self.beam_size)
        _at_most(f"{prefix}.beam_size", self.beam_size, MAX_BEAM_SIZE)
        positive(f"{prefix}.lenpen", self.lenpen, minimum=0)
        positive(f"{prefix}.nbest", self.nbest)
        if self.method != "beam":
            require(self.nbest == 1, f"{prefix}.nbest", self.nbest,
                    f"{'greedy search' if self.method == 'greedy' else 'sampling'} gives one "
                    "hypothesis: use decode=beam for an n-best list")
        else:
            require(self.nbest <= self.beam_size, f"{prefix}.nbest", self.nbest,
                    f"cannot exceed {prefix}.beam_size={self.beam_size}")
        positive(f"{prefix}.max_len_a", self.max_len_a, minimum=0)
        positive(f"{prefix}.max_len_b", self.max_len_b, minimum=0)
        require(self.max_len_a + self.max_len_b >= 1, f"{prefix}.max_len_b", self.max_len_b,
                f"with {prefix}.max_len_a={self.max_len_a} the length limit a * |x| + b "
                "could be 0: need a + b >= 1")
        positive(f"{prefix}.min_len", self.min_len, minimum=0)
        positive(f"{prefix}.batch_tokens", self.batch_tokens, optional=True)
        if self.batch_tokens is not None:
            _at_most(f"{prefix}.batch_tokens", self.batch_tokens, MAX_BATCH_TOKENS)
        positive(f"{prefix}.max_batch_size", self.max_batch_size, optional=True)
        if self.max_batch_size is not None:
            _at_most(f"{prefix}.max_batch_size", self.max_batch_size, MAX_BATCH_TOKENS)
        positive(f"{prefix}.no_repeat_ngram_size", self.no_repeat_ngram_size, minimum=0)
        _at_most(f"{prefix}.no_repeat_ngram_size", self.no_repeat_ngram_size, MAX_NO_REPEAT_NGRAM)
        require(self.precision in PRECISIONS, f"{prefix}.precision", self.precision,
                f"choose one of {', '.join(PRECISIONS)}")
        require(self.compile in COMPILE_MODES, f"{prefix}.compile", self.compile,
                f"choose one of {', '.join(COMPILE_MODES)}")
        positive(f"{prefix}.sampling_topk", self.sampling_topk, minimum=0)
        require(0 < self.sampling_topp <= 1, f"{prefix}.sampling_topp", self.sampling_topp,
                "must be in (0, 1]")
        require(self.sampling_temperature > 0, f"{prefix}.sampling_temperature",
                self.sampling_temperature, "must be > 0")
        positive(f"{prefix}.seed", self.seed, minimum=0)
        positive(f"{prefix}.sync_every", self.sync_every, optional=True)
        if self.sync_every is not None:
            _at_most(f"{prefix}.sync_every", self.sync_every, MAX_SYNC_EVERY)


@dataclass
class TrainConfig:
    """A training run: `configs/train.yaml` composes one preset of each group."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The model group."""
    data: DataConfig = field(default_factory=DataConfig)
    """The data group."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The optim group."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """The trainer group."""
    decode: DecodeConfig = field(default_factory=lambda: DecodeConfig(method="greedy"))
    """The decode group: validation's search (greedy in configs/train.yaml)."""

    def validate(self) -> None:
        for group in ("model", "data", "optim", "trainer", "decode"):
            getattr(self, group).validate(group)
        # training pairs of data.max_len tokens plus BOS or EOS must fit the positional table
        require(self.model.max_positions > self.data.max_len, "model.max_positions",
                self.model.max_positions, f"must exceed data.max_len={self.data.max_len} (a pair "
                "plus its BOS/EOS)")


# config group -> the dataclass its presets start from (`configs/<group>/*.yaml`)
GROUPS: dict[str, type] = {"model": ModelConfig, "data": DataConfig, "optim": OptimConfig,
                           "trainer": TrainerConfig, "decode": DecodeConfig}


def check_device(key: str, device: str) -> None:
    require(re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", device) is not None, key, device,
            "choose auto, cpu, cuda or cuda:N")
    if device == "mps":
        import torch  # only here: the settings themselves need no torch

        require(torch.backends.mps.is_available(), key, device,
                f"Apple's MPS is not available on this machine: use {key}=cpu or {key}=auto")


T = TypeVar("T")


def _check_finite(value: Any, key: str = "") -> None:
    """Every float setting is a finite number: `optim.lr=inf` or `nan` slips past a range
    check (`inf > 0`, and NaN compares false both ways), and trains nothing."""
    if isinstance(value, float):
        require(math.isfinite(value), key, value, "must be a finite number")
    elif is_dataclass(value):
        for f in fields(value):
            _check_finite(getattr(value, f.name), f"{key}.{f.name}" if key else f.name)
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_finite(v, f"{key}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_finite(v, f"{key}[{i}]")


def load_preset(schema: type, path: str | Path) -> DictConfig:
    """A group's preset (`configs/<group>/<name>.yaml`) read without Hydra, for scripts: the
    dataclass's defaults with what the preset changes (its defaults list, which names the
    schema, dropped). Every key is there, so a script may override any of them."""
    preset = OmegaConf.load(path)
    preset.pop("defaults", None)
    return OmegaConf.merge(OmegaConf.structured(schema), preset)


def omegaconf_error_line(e: OmegaConfBaseException) -> str:
    """An OmegaConf error (a value of the wrong type, a key the schema lacks) as one line
    naming its key; the error's own text spans several lines."""
    key = getattr(e, "full_key", None)
    msg = str(getattr(e, "msg", None) or e).strip().splitlines()[0]
    return f"{key}: {msg}" if key else msg


def to_dataclass(schema: type[T], cfg: DictConfig | dict[str, Any]) -> T:
    """Check a composed config against its dataclass and return the typed object.

    Unknown keys and values of the wrong type raise an OmegaConf error that names the key;
    values out of range a `ConfigError` that names it (the class's `validate`).
    """
    # As plain data: a composed group is typed by its dataclass schema already, and merging
    # it as such would let through a key a `+` override added to it (`+optim.lrr=1`).
    plain = OmegaConf.to_container(cfg) if isinstance(cfg, DictConfig) else cfg
    merged = OmegaConf.merge(OmegaConf.structured(schema), plain)
    obj = OmegaConf.to_object(merged)
    _check_finite(obj)
    if hasattr(obj, "validate"):
        obj.validate()  # type: ignore[union-attr]
    return obj  # type: ignore[return-value]
