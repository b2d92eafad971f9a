"""The weights a model decodes with, in the dtype the decoder step computes in.

A decoder step under autocast casts every fp32 weight it reads to bf16 or fp16, at every
call: counted on a CPU on the path a GPU runs, those casts are the most frequent op of
such a step. A model held in the compute dtype (CTranslate2's `compute_type`) runs without
autocast and casts nothing. `held_in` swaps such copies in for one call, when a model is
kept in fp32 for training or by its loader; `loading.load_for_inference(dtype=...)` and
`Translator.load(dtype=...)` load the weights in that dtype once, and a `Translator`,
whose model threads share, decodes a call in another dtype on a copy (`DtypeCopies`):
of its model's weights, or, where those are a rounding of its checkpoint's (bf16 of
fp32), of the checkpoint's own.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Callable, Iterator

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


def rounds_to(model: nn.Module, rounded: nn.Module) -> bool:
    """Whether `rounded` holds `model`'s weights cast to its dtypes: every entry of their
    state dicts (same names), floating ones cast to `rounded`'s dtype, equal."""
    mine, theirs = model.state_dict(), rounded.state_dict()
    return mine.keys() == theirs.keys() and all(
        a.shape == b.shape and torch.equal(a.to(b.dtype), b) for a, b in
        ((mine[k], theirs[k]) for k in mine))


class DtypeCopies:
    """A model in each dtype a call asks for: itself in its own; else a copy made at the
    first call that asks and kept while the model's weights stay as they were (a model
    still training gets a fresh copy after its next update). Threads may share one: those
    that ask at once get one copy.

    `originals(dtype)`: for a model whose weights are a rounding of others (bf16 weights
    of an fp32 checkpoint), the others in `dtype`, read again: a copy is made from them,
    not from the rounded weights, while the model's weights stay as they were given.
    """

    def __init__(self, model: nn.Module,
                 originals: Callable[[torch.dtype], nn.Module] | None = None) -> None:
        self.model, self._originals, self._given = model, originals, _versions(model)
        self._copies: dict[torch.dtype, tuple[tuple, nn.Module]] = {}  # dtype -> (versions, copy)
        self._copying = threading.Lock()

    def get(self, dtype: torch.dtype) -> nn.Module:
        """The model in `dtype` (the class docstring says which)."""
        if floating_dtype(self.model) in (dtype, None):
            return self.model
        versions = _versions(self.model)
        kept = self._copies.get(dtype)
        if kept is None or kept[0] != versions:
            with self._copying:  # the first thread makes it, the others take it
                kept = self._copies.get(dtype)
                if kept is None or kept[0] != versions:
                    rounded = self._originals is not None and versions == self._given
                    made = self._originals(dtype) if rounded else copied_in(self.model, dtype)
                    kept = self._copies[dtype] = (versions, made)
        return kept[1]


def _versions(model: nn.Module) -> tuple:
    """What changes when a parameter of the model is replaced or updated in place."""
    return tuple((id(p), p._version) for p in model.parameters())
