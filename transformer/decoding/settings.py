"""The decode settings as they will run: `decode_settings` fills in a DecodeConfig's
device-dependent defaults (precision, batch size) and checks them against the model, so
that what runs is what a report says ran.

Settings are resolved once, where a call enters (a `Translator`, a command, one call's
own settings), and every batch and window after reuses them: a config this returned,
asked again for the same device and model and unchanged since, comes back as it is,
without a second check or a second reading of the free GPU memory.
"""

from __future__ import annotations

import dataclasses

import torch

from transformer.bounds import available_memory
from transformer.config import ConfigError, DecodeConfig
from transformer.decoding.batch_memory import decode_batch_tokens
from transformer.device import resolve_precision

# On a CPU, batches larger than 2,000 source tokens decode greedy and beam 5 no faster (the
# small model; docs/results/decoding-speed.md, "Batch size", has the figures). On CUDA the batch
# doubles from 8,000 while half the free memory holds its worst case
# (`batch_memory.decode_batch_tokens`), below the ceiling of 65,536: 64,000 source tokens at
# most. A GPU decodes more sentences a step for little more time.
CPU_BATCH_TOKENS, CUDA_BATCH_TOKENS, CUDA_BATCH_TOKENS_CEILING = 2000, 8000, 65536

# A resolved precision's dtype: what the weights are held in while decoding.
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# The attribute a resolved config carries: what it was resolved for, and its values then.
_RESOLVED = "_resolved_for"


def decode_settings(cfg: DecodeConfig, device: torch.device, model=None) -> DecodeConfig:
    """`cfg` with its device-dependent defaults filled in.

    precision auto: `decode_precision`; batch_tokens null: on CUDA with our model, what
    half the free memory holds, 8,000, 16,000, 32,000 or 64,000 source tokens
    (`batch_memory.decode_batch_tokens`), else 8,000; 2,000 on a CPU. An exported `model`
    computes in the type it was exported with: its precision stays auto, and any other is
    refused. A config this returned is returned as it is for the same device and model
    (module docstring).
    """
    if resolved(cfg, device, model):
        return cfg
    cfg.validate()
    exported = hasattr(model, "quantization")  # a CT2Model (ct2_model.py), not imported here
    if exported:
        if cfg.precision != "auto":
            raise ConfigError(f"decode.precision={cfg.precision}: an exported model computes "
                              f"in the type it was exported with ({model.quantization}); "
                              "leave decode.precision=auto")
        precision = "auto"
    else:
        precision = decode_precision(cfg.precision, device)
    batch_tokens = cfg.batch_tokens
    if batch_tokens is None:
        batch_tokens = CUDA_BATCH_TOKENS if device.type == "cuda" else CPU_BATCH_TOKENS
    if cfg.batch_tokens is None and device.type == "cuda" and model is not None and not exported:
        batch_tokens = decode_batch_tokens(model.cfg, dataclasses.replace(cfg, precision=precision),
                                           available_memory(device), CUDA_BATCH_TOKENS,
                                           CUDA_BATCH_TOKENS_CEILING)
    out = dataclasses.replace(cfg, precision=precision, batch_tokens=batch_tokens)
    setattr(out, _RESOLVED, (_target(device, model), dataclasses.astuple(out)))
    return out


def decode_precision(precision: str, device: torch.device, key: str = "decode.precision") -> str:
    """The precision a checkpoint decodes in. auto: fp32 on a CPU, bf16 on a GPU that has
    it, else fp16; an explicit one is checked (`device.resolve_precision`).

    On a CPU, auto is fp32 even where bf16 is native (where training's auto is bf16): a
    CTranslate2 export computes in fp32 there (its CPU backend has no bf16), so a checkpoint
    and its fp32 export translate alike by default (in bf16 the search breaks some near-ties
    the other way: docs/deploying.md, "A checkpoint and its export"). `decode.precision=bf16`
    asks for bf16, faster on a CPU with native bf16 at a small cost in BLEU (docs/results/precision.md,
    "Decoding: bf16 against fp32")."""
    resolved = resolve_precision(precision, device, key=key)[0]  # checked as training's
    return "fp32" if precision == "auto" and device.type == "cpu" else resolved


def resolved(cfg: DecodeConfig, device: torch.device, model=None) -> bool:
    """Whether `cfg` is what `decode_settings` gave for this device and model, unchanged."""
    return getattr(cfg, _RESOLVED, None) == (_target(device, model), dataclasses.astuple(cfg))


def _target(device: torch.device, model) -> tuple:
    """What a resolution depends on: the device, and the model's kind and shape (a copy of
    the model in another dtype, or on the same device, resolves alike)."""
    return torch.device(device), hasattr(model, "quantization"), getattr(model, "cfg", None)
