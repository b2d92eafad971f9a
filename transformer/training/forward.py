"""The forward and loss of a training update (`TrainForward`): compiled, or eager with the
Linear layers' weights cast to autocast's dtype once per update (`LowPrecisionWeights`).

`trainer.compile` (null: on for CUDA, off elsewhere) compiles the forward together with
the loss (`torch.compile(batch_loss)`; under DDP the wrapped module, which dynamo splits at
its buckets). Every batch's rows, source and target lengths and count of predicted tokens
are marked dynamic (`mark_batch_dynamic`) before the call, so the first compile is already
the graph with symbolic sizes that serves every later shape, instead of a graph of the
first batch's sizes and one more compile for each size found to vary. A dimension that is
1 in the batch being compiled (a batch of one sentence) is still specialised by dynamo:
such a batch gets a graph of its own, at most once. The backward is compiled with the
forward, inside the first call, whose time the log reports
(`compiled the training step in N s (the first update's forward and backward)`). If
compiling fails (no C++ compiler, no Triton, an error of the backend), the log says so in
one line and training goes on eagerly.

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
import logging
import time
from collections.abc import Iterator

import torch
from torch import nn
from torch._functorch import config as functorch_config

from transformer.data.batching import Batch
from transformer.training.loss import batch_loss

log = logging.getLogger(__name__)


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


# Inside a compiled call, the backward is compiled with the forward (AOT autograd would
# otherwise put it off to the first backward when it sees no size the backward needs):
# compiling then fails, if it does, where `TrainForward` can fall back to eager, and the
# first call's time covers both.
_BACKWARD_WITH_FORWARD = functorch_config.patch(force_non_lazy_backward_lowering=True)


def mark_batch_dynamic(batch: Batch) -> None:
    """Mark what varies from batch to batch dynamic for dynamo: B, S and T of the id
    tensors and N of `predict_index`. Each size gets a symbol of its own (a marked size is
    never duck-sized with another of equal value, e.g. S == T in one batch); a size of 1
    is specialised rather than refused (`maybe_mark_dynamic`, not `mark_dynamic`)."""
    for ids in (batch.src_ids, batch.tgt_in_ids, batch.tgt_out_ids):
        torch._dynamo.maybe_mark_dynamic(ids, [0, 1])
    torch._dynamo.maybe_mark_dynamic(batch.predict_index, 0)


def first_line(error: BaseException) -> str:
    """`Type: message`'s first line of what a failed compile raised (the backend's own
    error, not dynamo's wrapper around it)."""
    inner = getattr(error, "inner_exception", None) or error
    lines = str(inner).strip().splitlines()
    return f"{type(inner).__name__}: {lines[0]}" if lines else type(inner).__name__


class TrainForward:
    """The loss of a micro-batch as the trainer computes it: `batch_loss` through `net`,
    compiled (`compile`; None: on CUDA) or eager, where mixed precision reads the
    `LowPrecisionWeights` of `model`. `net` is what the forward runs through afterwards
    (DDP, compiled under DDP). A compile that fails leaves it eager from then on.

    Args:
        model: the Transformer.
        net: `model`, or its DistributedDataParallel wrapper.
        precision: the resolved precision (fp32, bf16, fp16).
        device: the training device.
        compile: `trainer.compile`.
    """

    def __init__(self, model: nn.Module, net: nn.Module, precision: str, device: torch.device,
                 compile: bool | None) -> None:
        self.model, self.eager_net, self.precision, self.device = model, net, precision, device
        self.compiled = compile if compile is not None else device.type == "cuda"
        self.compile_seconds: float | None = None  # the first compiled call's, once it returned
        self.compile_error: str | None = None  # the first line of what a failed compile raised
        self.net, self.loss_fn = net, batch_loss
        if self.compiled and net is model:
            self.loss_fn = torch.compile(batch_loss)
        elif self.compiled:
            self.net = torch.compile(net)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.low_dtype = dtype if net is model else None  # eager copies: one process only
        self.low = LowPrecisionWeights(model, dtype) if self.low_dtype and not self.compiled else None

    def __call__(self, batch: Batch, label_smoothing: float, first: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(summed loss, summed NLL) of `batch` (on the device); `first`: the update's first
        micro-batch, before which the low-precision copies are refreshed."""
        if self.compiled:
            try:
                return self._compiled(batch, label_smoothing)
            except torch._dynamo.exc.TorchDynamoException as e:
                self.compile_error = first_line(e)
                log.warning("compiling the training step failed (%s); training goes on eagerly", self.compile_error)
                self.compiled, self.net, self.loss_fn = False, self.eager_net, batch_loss
        if first and self.low is None and self.low_dtype is not None:  # eager since a failed compile
            self.low = LowPrecisionWeights(self.model, self.low_dtype)
        if self.low is None:
            return self.loss_fn(self.net, batch, label_smoothing, self.precision, self.device)
        if first:
            self.low.refresh()
        with self.low.swapped():
            return self.loss_fn(self.net, batch, label_smoothing, self.precision, self.device)

    def _compiled(self, batch: Batch, label_smoothing: float) -> tuple[torch.Tensor, torch.Tensor]:
        """The compiled call; the first is timed on the host (it compiles; nothing is read
        back from the device for it), and the time logged."""
        mark_batch_dynamic(batch)
        start = time.perf_counter() if self.compile_seconds is None else None
        with _BACKWARD_WITH_FORWARD:
            out = self.loss_fn(self.net, batch, label_smoothing, self.precision, self.device)
        if start is not None:
            self.compile_seconds = time.perf_counter() - start
            log.info("compiled the training step in %.1f s (the first update's forward and backward)",
                     self.compile_seconds)
        return out

    def after_backward(self, first: bool) -> None:
        """After a micro-batch's backward: the fp32 parameters' gradients in `.grad`."""
        if self.low is not None:
            self.low.collect(first)
