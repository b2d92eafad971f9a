"""Fine-tuning: a new run that starts from a trained model's weights (`trainer.init_from`).

Unlike `trainer.resume`, which continues one run exactly (optimizer, schedule, data
order), a fine-tuning run is a run of its own, in its own directory, on its own data:
- the weights come from the checkpoint, and so does the model config (the architecture
  cannot change; the dropout rates may);
- the optimizer and the learning-rate schedule start afresh (its own `optim.lr` and
  `optim.warmup_steps`, counted from its step 0);
- the checkpoint's SentencePiece model encodes the new data (no vocabulary is trained;
  the prepared-data cache is keyed by it);
- its checkpoints record the checkpoint they started from (meta.json `init_from`), and
  once it has one of its own, `trainer.resume=auto` continues it, never its parent.
As OpenNMT-py's `train_from` with `reset_optim`, fairseq's `--finetune-from-model`, Marian's
`--pretrained-model`.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from transformer import checkpoint as ckpt
from transformer.config import ConfigError, ModelConfig
from transformer.decoding.ct2_model import is_export

# What a fine-tuning run may set differently from its parent; the rest is the architecture.
TUNABLE = ("dropout", "attn_dropout", "ffn_dropout")
# Set from the tokenizer, which is the parent's: never the user's to change.
_FROM_TOKENIZER = ("vocab_size", "pad_id", "bos_id", "eos_id")


def parent_checkpoint(init_from: str, resume: str) -> Path:
    """The checkpoint directory `trainer.init_from` names, checked: a training checkpoint
    with weights and a tokenizer, given without a `trainer.resume` path."""
    if resume not in ("auto", "never"):
        raise ConfigError(f"trainer.init_from={init_from} with trainer.resume={resume}: both say "
                          "where the weights come from; fine-tune with init_from, or continue a "
                          "run with resume, not both")
    path = Path(init_from).expanduser().absolute()
    if is_export(path):
        raise ConfigError(f"trainer.init_from={init_from} is a CTranslate2 export (mt-export), "
                          "not a training checkpoint: give the checkpoint it was exported from")
    if not path.is_dir():
        raise ConfigError(f"trainer.init_from={init_from}: no checkpoint directory at {path}")
    ckpt.load_model_config(path)  # model.json: missing or corrupt is a one-line error
    for name in (ckpt.WEIGHTS, ckpt.TOKENIZER):
        if not (path / name).is_file():
            raise ConfigError(f"trainer.init_from={init_from}: checkpoint {path} is missing {name}")
    ckpt.load_tokenizer(path)  # the one it was written with (its SHA-256), before any data is encoded
    return path


def check_tokenizer_setting(init_from: str, tokenizer: str | None) -> None:
    if tokenizer:
        raise ConfigError(f"data.tokenizer={tokenizer} with trainer.init_from={init_from}: a "
                          "fine-tuning run encodes its data with the checkpoint's own tokenizer; "
                          "drop data.tokenizer")


def model_from_parent(parent: Path, explicit: dict[str, object]) -> ModelConfig:
    """The parent's model config, with the tunable settings given on the command line
    (`explicit`: model.<key> overrides, key -> composed value). An architecture setting
    that differs from the parent's is a ConfigError naming the key."""
    saved = ckpt.load_model_config(parent)
    for key, value in explicit.items():
        if key in TUNABLE:
            continue
        if key in _FROM_TOKENIZER or getattr(saved, key, None) != value:
            raise ConfigError(
                f"model.{key}={value!r}: trainer.init_from={parent} takes the model from the "
                f"checkpoint (model.{key}={getattr(saved, key, None)!r}); only "
                f"{', '.join('model.' + k for k in TUNABLE)} may change: drop the override")
    return dataclasses.replace(saved, **{k: v for k, v in explicit.items() if k in TUNABLE})


def check_architecture(parent: Path, model_cfg: ModelConfig) -> None:
    """The model about to be trained has the parent's architecture (an API caller's config)."""
    saved = dataclasses.asdict(ckpt.load_model_config(parent))
    ours = dataclasses.asdict(model_cfg)
    fixed = (*TUNABLE, *_FROM_TOKENIZER)  # the latter follow the parent's tokenizer anyway
    changed = [k for k in saved if k not in fixed and saved[k] != ours[k]]
    if changed:
        k = changed[0]
        raise ConfigError(f"model.{k}={ours[k]!r}: trainer.init_from={parent} was trained with "
                          f"model.{k}={saved[k]!r}; a fine-tuning run keeps the architecture")


def command_line_model_keys(overrides: list[str]) -> list[str]:
    """The `model.<key>` settings of Hydra's command-line overrides; a `model=<group>`
    choice is a ConfigError (the model comes from the checkpoint)."""
    keys = []
    for override in overrides:
        name = re.sub(r"^[+~]+", "", override.split("=", 1)[0])
        if name == "model":
            raise ConfigError(f"{override}: trainer.init_from takes the model from the checkpoint; "
                              "drop the model group")
        if name.startswith("model."):
            keys.append(name.removeprefix("model."))
    return keys
