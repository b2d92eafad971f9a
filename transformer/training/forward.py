"""The forward and loss of a training update (`TrainForward`): compiled, or eager with the
Linear layers' weights cast to autocast's dtype once per update (`LowPrecisionWeights`).

`trainer.compile` (null: on for CUDA, off elsewhere) compiles the forward together with
the loss (`torch.compile(batch_loss)`; under DDP the wrapped module, which dynamo splits at
its buckets), with automatic dynamic shapes: the first batch's shape, then one graph with
symbolic lengths and rows (tests/training/test_trainer.py holds the count).

Under autocast every `nn.Linear` casts its fp32 weight and bias to bf16 (fp16) in the
forward and their gradients back to fp32 in the backward: two ops per tensor and
micro-batch, about 270 of the ~1,300 ops of an eager update of the GPU recipe's shape
(`scripts/profile_update.py`'s trainer, counted with a TorchDispatchMode), each a kernel
launch on a GPU. Here the fp32 parameters stay what the optimizer updates and the
checkpoints save; one `_foreach_copy_` writes all their low-precision copies before an
update's first forward, the forward reads the copies (swapped into the modules for its
duration), and one `_foreach_copy_` (`_foreach_add_` for a further micro-batch) brings
their gradients back into fp32 buffers allocated once. The values are those autocast
computes: its casts round the same way, and the gradients are the same bf16 products,
converted once. Parameters used outside a Linear (the tied embedding matrix, LayerNorm's)
are left to autocast.

`LowPrecisionWeights` serves an eager, single-process run: a compiled step fuses
autocast's casts itself, and DistributedDataParallel reduces the gradients of the
parameters it wraps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from transformer.data.batching import Batch
from transformer.training.loss import batch_loss


def _linear_only(model: nn.Module) -> list[tuple[nn.Parameter, list[tuple[nn.Module, str]]]]:
    """Each parameter every owner of which is an nn.Linear, with its (module, name) slots."""
    slots: dict[int, list[tuple[nn.Module, str]]] = {}
    params: dict[int, nn.Parameter] = {}
    linear_only: dict[int, bool] = {}
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            slots.setdefault(id(p), []).append((module, name))
            params[id(p)] = p
            linear_only[id(p)] = linear_only.get(id(p), True) and isinstance(module, nn.Linear)
    return [(params[i], slots[i]) for i in params if linear_only[i] and params[i].requires_grad]


class LowPrecisionWeights:
    """Low-precision copies of a model's Linear weights and biases, refreshed once per update.

    Use per micro-batch: `refresh()` before an update's first forward, the forward inside
    `swapped()`, the backward, then `collect(first)`: the fp32 parameters then hold the
    gradients in `.grad`, as autocast's backward would have left them.

    Args:
        model: the module whose forward runs (not a DDP wrapper).
        dtype: autocast's dtype (bf16 or fp16).
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        found = _linear_only(model)
        self.params = [p for p, _ in found]
        self.slots = [slots for _, slots in found]
        self.low = [nn.Parameter(torch.empty_like(p, dtype=dtype)) for p in self.params]
        self.grads = [torch.empty_like(p) for p in self.params]  # fp32, written in place
        self.used = [False] * len(self.params)  # a gradient came in this update (host facts)

    def refresh(self) -> None:
        """Copy the fp32 weights into their low-precision copies (one op)."""
        with torch.no_grad():
            torch._foreach_copy_(self.low, self.params)

    @contextlib.contextmanager
    def swapped(self) -> Iterator[None]:
        """The modules hold the low-precision copies inside (for the forward)."""
        for slots, low in zip(self.slots, self.low):
            for module, name in slots:
                module._parameters[name] = low
        try:
            yield
        finally:
            for slots, p in zip(self.slots, self.params):
                for module, name in slots:
                    module._parameters[name] = p

    def collect(self, first: bool) -> None:
        """The copies' gradients into the fp32 parameters' `.grad` (the first micro-batch of
        an update writes them, a later one adds); the copies' gradients are dropped. A
        weight no micro-batch of the update used keeps `.grad` None, as autocast leaves
        it, so the optimizer skips it rather than stepping it on a zero gradient."""
        low_grads = [low.grad if low.grad is not None else torch.zeros_like(low) for low in self.low]
        self.used = [(not first and was) or low.grad is not None for was, low in zip(self.used, self.low)]
        with torch.no_grad():
            if first:
                torch._foreach_copy_(self.grads, low_grads)
            else:
                torch._foreach_add_(self.grads, low_grads)
        for p, g, low, used in zip(self.params, self.grads, self.low, self.used):
            p.grad = g if used else None
            low.grad = None


class TrainForward:
    """The loss of a micro-batch as the trainer computes it: `batch_loss` through `net`,
    compiled (`compile`; None: on CUDA) or eager, where mixed precision reads the
    `LowPrecisionWeights` of `model`. `net` is what the forward runs through afterwards
    (DDP, compiled under DDP).

    Args:
        model: the Transformer.
        net: `model`, or its DistributedDataParallel wrapper.
        precision: the resolved precision (fp32, bf16, fp16).
        device: the training device.
        compile: `trainer.compile`.
    """

    def __init__(self, model: nn.Module, net: nn.Module, precision: str, device: torch.device,
                 compile: bool | None) -> None:
        self.precision, self.device = precision, device
        self.compiled = compile if compile is not None else device.type == "cuda"
        self.net, self.loss_fn = net, batch_loss
        if self.compiled and net is model:
            self.loss_fn = torch.compile(batch_loss)
        elif self.compiled:
            self.net = torch.compile(net)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        eager_alone = net is model and not self.compiled
        self.low = LowPrecisionWeights(model, dtype) if dtype and eager_alone else None

    def __call__(self, batch: Batch, label_smoothing: float, first: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(summed loss, summed NLL) of `batch` (on the device); `first`: the update's first
        micro-batch, before which the low-precision copies are refreshed."""
        if self.low is None:
            return self.loss_fn(self.net, batch, label_smoothing, self.precision, self.device)
        if first:
            self.low.refresh()
        with self.low.swapped():
            return self.loss_fn(self.net, batch, label_smoothing, self.precision, self.device)

    def after_backward(self, first: bool) -> None:
        """After a micro-batch's backward: the fp32 parameters' gradients in `.grad`."""
        if self.low is not None:
            self.low.collect(first)
