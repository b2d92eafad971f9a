"""What several test modules share: composing the real configs and short debug training runs."""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from transformer.checkpoint import save_checkpoint
from transformer.commands import cli
from transformer.commands.evaluate import EvaluateConfig
from transformer.commands.masks import MasksConfig
from transformer.commands.prepare import PrepareConfig
from transformer.commands.train import train
from transformer.commands.translate import TranslateConfig
from transformer.config import ModelConfig, TrainConfig, to_dataclass
from transformer.data.corpus import read_lines
from transformer.data.tokenizer import Tokenizer, train_tokenizer
from transformer.deploy.ct2_export import ExportConfig
from transformer.model.transformer import Transformer, build_model
from transformer.paths import CONFIG_DIR, PROJECT_ROOT
from transformer.training.trainer import Trainer

SAMPLE = PROJECT_ROOT / "data" / "sample"

# Hydra config -> the dataclass its command fills (`cli.hydra_entry(prog, main, schema)`)
COMMAND_SCHEMAS = {"train": TrainConfig, "translate": TranslateConfig, "evaluate": EvaluateConfig,
                   "prepare": PrepareConfig, "masks": MasksConfig, "export": ExportConfig}

# The debug preset on the shipped sample corpus: a tiny model, 20 CPU steps, no bar.
DEBUG = ["debug=default", "data=sample", "trainer.progress=false", "trainer.num_threads=1"]


def shared_cache() -> Path:
    """One prepared-data cache for the whole test session (conftest.py sets it): entries are
    keyed by the corpus text and every setting that shapes it, so tests that prepare
    the same data reuse it and tests that prepare other data do not see it."""
    return Path(os.environ["MT_TEST_DATA_CACHE"])


def compose_cfg(*overrides: str, config: str = "train", return_hydra_config: bool = False) -> DictConfig:
    """`config` composed as the `mt-*` commands compose it: against the groups' dataclass
    schemas that `cli.register_configs` stores (as importing cli does for the commands)."""
    cli.register_configs()
    cli.register_command(config, COMMAND_SCHEMAS[config])  # as cli.hydra_entry does
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config, overrides=list(overrides), return_hydra_config=return_hydra_config)


def run(run_dir: Path, *overrides: str) -> Trainer:
    """A debug training run into run_dir (prepared data from the session's shared cache)."""
    cfg = compose_cfg(*DEBUG, f"trainer.run_dir={run_dir}", f"data.cache_dir={shared_cache()}",
                      *overrides)
    return train(to_dataclass(TrainConfig, cfg), OmegaConf.to_yaml(cfg))


def scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of every event of `tag`, in the order they were written.

    EventAccumulator reads a run's event files in name order, and the names end with a
    per-process counter: a resumed run's file `...<time>.<pid>.10` written in the same second
    as `...<time>.<pid>.9` would be read first. So the events are put in time order.
    """
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return [(e.step, e.value) for e in sorted(acc.Scalars(tag), key=lambda e: e.wall_time)]


@functools.cache
def sample_tokenizer(vocab_size: int = 300) -> Tokenizer:
    """A SentencePiece vocabulary trained on both sides of data/sample's training pairs."""
    return train_tokenizer(read_lines(SAMPLE / "train.it") + read_lines(SAMPLE / "train.en"),
                           vocab_size=vocab_size)


def tiny_checkpoint(path: Path, seed: int = 0, **model: int) -> Path:
    """A checkpoint of a random tiny model (d_model 32, 4 heads, 2+2 layers unless
    overridden) with the sample vocabulary: for tests of decoding and the commands."""
    tokenizer = sample_tokenizer()
    torch.manual_seed(seed)
    settings = dict(d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2,
                    max_positions=64) | model
    cfg = ModelConfig(vocab_size=tokenizer.vocab_size, **settings)
    return save_checkpoint(path, build_model(cfg), tokenizer, "", {})


def renamed_piece(proto: bytes) -> tuple[bytes, str, str]:
    """A SentencePiece model with one piece renamed (its last letter changed, the length
    kept): it still loads, and an id decodes to another piece (the probe's "▁is" -> "▁iz").
    Returns the changed model, the old piece and the new one."""
    tokenizer = Tokenizer.from_proto(proto)
    pieces = {tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)}
    for i in range(4, tokenizer.vocab_size):
        old = tokenizer.id_to_piece(i)
        if len(old) < 2 or not old[-1].isascii() or not old[-1].isalpha() or proto.count(old.encode()) != 1:
            continue
        new = next((p for c in "zqxjkwy" if (p := old[:-1] + c) not in pieces), None)
        if new is not None:
            changed = proto.replace(old.encode(), new.encode())
            Tokenizer.from_proto(changed)  # loads: only a checksum tells
            return changed, old, new
    raise AssertionError("no piece to rename")


@torch.no_grad()
def end_sentences(model: Transformer, rate: float = 0.1) -> None:
    """Give EOS a constant logit that beats every other token at about `rate` of the steps,
    and <pad> one that never does.

    Coordinate 0 of the last LayerNorm's output is made the constant 1 (weight 0, bias 1),
    and column 0 of the output matrix holds the constants. (Our decoder takes a generated
    <pad> for padding, CTranslate2 for a token; a trained model never writes it.)
    """
    cfg = model.cfg
    last = model.decoder_norm if cfg.pre_norm else model.decoder_layers[-1].ffn_res.norm
    last.weight[0], last.bias[0] = 0.0, 1.0
    model.out_proj.weight[:, 0] = 0.0
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, cfg.vocab_size, (16, 12), generator=g)
    tgt = torch.randint(4, cfg.vocab_size, (16, 20), generator=g)
    logits = model(src, tgt)
    logits[..., [cfg.eos_id, cfg.pad_id]] = -math.inf
    model.out_proj.weight[cfg.eos_id, 0] = logits.max(-1).values.flatten().quantile(1 - rate)
    model.out_proj.weight[cfg.pad_id, 0] = -20.0


# (pre_norm, tie_embeddings, seed) of the exports' tests (tests/deploy): seeds whose models,
# once `end_sentences` is applied, end most beam searches before the length limit
# (test_ct2_export's test_beam_... checks that they do).
EXPORT_VARIANTS = {"post-tied": (False, True, 0), "post-untied": (False, False, 0),
                   "pre-tied": (True, True, 0), "pre-untied": (True, False, 1)}


def perturbed_model(vocab_size: int, pre_norm: bool, tie: bool, seed: int = 0, max_len: int = 64,
                    eos_rate: float | None = 0.1) -> Transformer:
    """A random tiny model with every parameter perturbed (non-zero biases, LayerNorm
    weights away from 1, a non-zero padding embedding), so that no part of an export's
    conversion passes by accident; `end_sentences` at `eos_rate` unless None."""
    cfg = ModelConfig(vocab_size=vocab_size, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2,
                      n_decoder_layers=2, max_positions=max_len, pre_norm=pre_norm, tie_embeddings=tie,
                      dropout=0.0, attn_dropout=0.0, ffn_dropout=0.0)
    torch.manual_seed(seed)
    model = build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    if eos_rate is not None:
        end_sentences(model, eos_rate)
    return model


# A tiny model for property tests: ids 0-3 are special, TINY_V ids in all.
PAD, BOS, EOS, TINY_V = 0, 2, 3, 24


def tiny_model(pre_norm: bool = False, seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=TINY_V, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2,
                      n_decoder_layers=2, dropout=0.0, attn_dropout=0.0, max_positions=32,
                      pre_norm=pre_norm, pad_id=PAD, bos_id=BOS, eos_id=EOS)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return Transformer(cfg).eval()


def pad_batch(seqs: list[list[int]]) -> torch.Tensor:
    """Right-pad lists of ids into a (B, L) tensor."""
    width = max(len(s) for s in seqs)
    return torch.tensor([s + [PAD] * (width - len(s)) for s in seqs])


# Lines for the random tiny model (`checkpoint` in conftest.py): empty, blank, several words.
LINES = ["Che ore sono?", "", "Ti chiamo stasera.", "   ", "Sì, certo!", "Ci vediamo martedì alle due."]
FAST = dict(method="greedy", max_len_a=0.0, max_len_b=6)  # a random model never stops early
