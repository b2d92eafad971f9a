"""Self-describing checkpoints that never execute code on load.

A checkpoint is a directory:
    model.safetensors   weights (safetensors: tensors only, no pickle)
    model.json          the ModelConfig
    tokenizer.model     the SentencePiece model
    config.yaml         the resolved run config
    meta.json           step, epoch, dev scores, time
    trainer_state.pt    optimizer, scheduler, grad scaler, RNG states, data position
                        (loaded with torch.load(weights_only=True); optional)
`model.*`, `tokenizer.model` and `config.yaml` are all that translating needs.

Writes are atomic: everything goes to `<name>.tmp-<pid>/`, which is renamed into place
only when complete, so a crash or Ctrl-C mid-write leaves the previous checkpoints intact.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model as load_safetensors
from safetensors.torch import save_model as save_safetensors

from transformer.config import ModelConfig
from transformer.model import Transformer, build_model
from transformer.tokenizer import Tokenizer

WEIGHTS, MODEL_CFG, TOKENIZER, RUN_CFG, META, STATE = (
    "model.safetensors", "model.json", "tokenizer.model", "config.yaml", "meta.json",
    "trainer_state.pt",
)
STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupt; the message names the file."""


def save_checkpoint(
    path: str | Path,
    model: Transformer,
    tokenizer: Tokenizer,
    run_config_yaml: str,
    meta: dict[str, Any],
    trainer_state: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint directory atomically; returns its path."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_safetensors(model, str(tmp / WEIGHTS))  # handles the tied embedding matrices
    (tmp / MODEL_CFG).write_text(json.dumps(asdict(model.cfg), indent=2))
    (tmp / TOKENIZER).write_bytes(tokenizer.proto)
    (tmp / RUN_CFG).write_text(run_config_yaml)
    (tmp / META).write_text(json.dumps(meta, indent=2))
    if trainer_state is not None:
        torch.save(trainer_state, tmp / STATE)
    old = path.with_name(f"{path.name}.old-{os.getpid()}")
    if path.exists():
        path.rename(old)
    tmp.rename(path)
    shutil.rmtree(old, ignore_errors=True)
    return path


def _require(path: Path, name: str) -> Path:
    f = path / name
    if not f.is_file():
        raise CheckpointError(f"checkpoint {path} is missing {name}"
                              if path.is_dir() else f"no checkpoint directory at {path}")
    return f


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[Transformer, Tokenizer]:
    """Load the model (in eval mode) and its tokenizer from a checkpoint directory."""
    path = Path(path)
    try:
        cfg = ModelConfig(**json.loads(_require(path, MODEL_CFG).read_text()))
    except (json.JSONDecodeError, TypeError) as e:
        raise CheckpointError(f"corrupt {path / MODEL_CFG}: {e}") from e
    model = build_model(cfg)
    try:
        load_safetensors(model, str(_require(path, WEIGHTS)), strict=True)
    except CheckpointError:
        raise
    except (SafetensorError, RuntimeError, OSError) as e:
        raise CheckpointError(f"corrupt weights {path / WEIGHTS}: {e}") from e
    try:
        tokenizer = Tokenizer.from_proto(_require(path, TOKENIZER).read_bytes())
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"corrupt tokenizer {path / TOKENIZER}: {e}") from e
    return model.to(device).eval(), tokenizer


def load_meta(path: str | Path) -> dict[str, Any]:
    return json.loads(_require(Path(path), META).read_text())


def load_trainer_state(path: str | Path) -> dict[str, Any]:
    """The trainer state, unpickled with weights_only=True (tensors and plain containers)."""
    f = _require(Path(path), STATE)
    try:
        return torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"corrupt trainer state {f}: {e}") from e


def step_checkpoints(run_dir: str | Path) -> list[Path]:
    """The complete `step_N` checkpoints of a run directory, oldest first."""
    ckpt_dir = Path(run_dir) / "checkpoints"
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir()
             if (m := STEP_DIR.match(p.name)) and (p / META).is_file()]
    return [p for _, p in sorted(found)]


def prune_checkpoints(run_dir: str | Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` step checkpoints (`best` is separate)."""
    for p in step_checkpoints(run_dir)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(p, ignore_errors=True)
