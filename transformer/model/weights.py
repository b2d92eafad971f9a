"""The weights a model decodes with, in the dtype the decoder step computes in.

A decoder step under autocast casts every fp32 weight it reads to bf16 or fp16, at every
call: counted on a CPU on the path a GPU runs, those casts are the most frequent op of
such a step. A model held in the compute dtype (CTranslate2's `compute_type`) runs without
autocast and casts nothing. `held_in` swaps such copies in for one call, when a model is
kept in fp32 for training or by its loader; `loading.load_for_inference(dtype=...)` and
`Translator.load(dtype=...)` load the weights in that dtype once, and a `Translator`,
whose model threads share, decodes a call in another dtype on a copy (`copied_in`).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch
from torch import nn


def floating_dtype(model: nn.Module) -> torch.dtype | None:
    """The dtype of the model's floating-point parameters (the first one's), None if none."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), None)


@contextlib.contextmanager
def held_in(model: nn.Module, dtype: torch.dtype) -> Iterator[nn.Module]:
    """Within the block, every floating parameter and buffer of `model` not in `dtype` is
    replaced by a copy in `dtype` (tied weights stay one tensor); the originals are put
    back on exit, untouched. Nothing is copied when the model is held in `dtype` already.

    The model is shared with whoever else holds it for the block's duration: use it for a
    call on a model no other thread trains or decodes with meanwhile.
    """
    swapped: list[tuple[dict, str, torch.Tensor]] = []
    originals: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, tensor in table.items():
                if tensor is not None and tensor.is_floating_point() and tensor.dtype != dtype:
                    originals.setdefault(id(tensor), tensor)
                    swapped.append((table, name, tensor))
    if originals:
        with torch.no_grad():  # one cast for all of them: two ops, not two per tensor
            flat = torch.cat([t.detach().reshape(-1) for t in originals.values()]).to(dtype)
        parts = flat.split([t.numel() for t in originals.values()])
        copies = {key: nn.Parameter(part.view(t.shape), requires_grad=False)
                  if isinstance(t, nn.Parameter) else part.view(t.shape)
                  for (key, t), part in zip(originals.items(), parts, strict=True)}
        for table, name, tensor in swapped:
            table[name] = copies[id(tensor)]
    try:
        yield model
    finally:
        for table, name, tensor in reversed(swapped):
            table[name] = tensor


def copied_in(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """`model` itself where its floating weights are in `dtype`; else a copy in `dtype`,
    the model untouched (a call on a model that other threads may use at the same time,
    where `held_in`'s swap would change it under them)."""
    if floating_dtype(model) in (dtype, None):
        return model
    return copy.deepcopy(model).to(dtype)
