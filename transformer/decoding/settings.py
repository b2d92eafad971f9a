"""The decode settings as they will run: `decode_settings` fills in a DecodeConfig's
device-dependent defaults (precision, batch size) and checks them against the model, so
that what runs is what a report says ran.
"""

from __future__ import annotations

import dataclasses

import torch

from transformer.bounds import available_memory
from transformer.config import ConfigError, DecodeConfig
from transformer.decoding.batch_memory import decode_max_tokens
from transformer.device import resolve_precision

# On a CPU, batches of 2,000 source tokens decode greedy and beam 5 faster than 8,000 (the
# small model; docs/performance.md, "Decoding speed", has the figures). On CUDA the batch
# doubles from 8,000 while half the free memory holds its worst case
# (`batch_memory.decode_max_tokens`), below the ceiling of 65,536: 64,000 source tokens at
# most. A GPU decodes more sentences a step for little more time.
CPU_MAX_TOKENS, CUDA_MAX_TOKENS, CUDA_MAX_TOKENS_CEILING = 2000, 8000, 65536

# A resolved precision's dtype: what the weights are held in while decoding.
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def decode_settings(cfg: DecodeConfig, device: torch.device, model=None) -> DecodeConfig:
    """`cfg` with its device-dependent defaults filled in.

    precision auto: bf16 on a GPU that has it (else fp16), bf16 on a CPU with native bf16,
    else fp32 (`device.resolve_precision`); max_tokens null: on CUDA with our model, what
    half the free memory holds, 8,000, 16,000, 32,000 or 64,000 source tokens (`batch_memory.decode_max_tokens`),
    else 8,000; 2,000 on a CPU. An exported `model` computes in the type it was exported with:
    its precision stays auto, and any other is refused.
    """
    cfg.validate()
    exported = hasattr(model, "quantization")  # a CT2Model (ct2_model.py), not imported here
    if exported:
        if cfg.precision != "auto":
            raise ConfigError(f"decode.precision={cfg.precision}: an exported model computes "
                              f"in the type it was exported with ({model.quantization}); "
                              "leave decode.precision=auto")
        precision = "auto"
    else:
        precision, _ = resolve_precision(cfg.precision, device, key="decode.precision")
    max_tokens = cfg.max_tokens
    if max_tokens is None:
        max_tokens = CUDA_MAX_TOKENS if device.type == "cuda" else CPU_MAX_TOKENS
    if cfg.max_tokens is None and device.type == "cuda" and model is not None and not exported:
        max_tokens = decode_max_tokens(model.cfg, dataclasses.replace(cfg, precision=precision),
                                       available_memory(device), CUDA_MAX_TOKENS,
                                       CUDA_MAX_TOKENS_CEILING)
    return dataclasses.replace(cfg, precision=precision, max_tokens=max_tokens)
