"""Adam and the inverse-square-root warm-up schedule of Vaswani et al. (2017), section 5.3,
and `Updater`, which applies each optimizer update (clipping, the skip of a non-finite
one, the schedule) and never reads the device.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from transformer.config import OptimConfig


def inverse_sqrt_lr(step: int, peak_lr: float, warmup_steps: int) -> float:
    """Linear warm-up to `peak_lr` at `warmup_steps`, then decay with 1/sqrt(step).

    The paper's d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) is this schedule with
    peak_lr = (d_model * warmup)^-0.5; here the peak is set directly, as in fairseq.
    """
    step = max(step, 1)
    warmup = max(warmup_steps, 1)
    return peak_lr * min(step / warmup, (warmup / step) ** 0.5)


def inverse_sqrt_lr_tensor(step: torch.Tensor, peak_lr: float, warmup_steps: int) -> torch.Tensor:
    """`inverse_sqrt_lr` of a 0-d float tensor `step` (>= 1), computed where it lives. In
    float64 it equals the Python float's value or differs in its last bit (torch's
    vectorised square root is not always correctly rounded)."""
    warmup = torch.full_like(step, max(warmup_steps, 1))  # not `float / tensor`: that multiplies by a reciprocal
    return peak_lr * torch.minimum(step / warmup, torch.sqrt(warmup / step))


def build_optimizer(model: nn.Module, cfg: OptimConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW (= Adam when weight_decay is 0); the fused kernel when `cfg.fused`.

    Fused, one kernel updates every parameter (CUDA, and CPU since torch 2.4); unfused,
    PyTorch's CPU default is a loop of about ten small ops per parameter tensor, a share of a
    small model's bf16 step on a CPU worth saving (docs/results/training-speed.md, "Why the
    step is built so", has it timed).
    """
    return torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
        weight_decay=cfg.weight_decay, fused=(cfg.fused and device.type in ("cuda", "cpu")) or None,
    )


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR whose factor times cfg.lr is `inverse_sqrt_lr`; stepped once per update."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: inverse_sqrt_lr(step + 1, 1.0, cfg.warmup_steps)
    )


def schedule_at(scheduler: torch.optim.lr_scheduler.LambdaLR, step: int) -> None:
    """Set the schedule's host record (what its state dict saves, `get_last_lr`, the
    optimizer groups' `lr`) to `step` applied updates, as `step` calls of `scheduler.step()`
    would have left it."""
    scheduler.last_epoch = step
    scheduler._last_lr = [base * fn(step) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, lr in zip(scheduler.optimizer.param_groups, scheduler._last_lr):
        group["lr"] = lr


class Updater:
    """Applies an optimizer update after the backward passes (a call), with no read of the
    device.

    Unscale (fp16), clip the gradient norm (`foreach`), and step, unless the norm is inf or
    NaN: then the update is skipped, weights and Adam's state untouched. The fused AdamW
    kernel takes that decision on the device (`found_inf`, the mechanism `GradScaler`
    uses), and the learning rate is computed on the device too, from the count of updates
    applied (`applied`), so a skipped update moves neither the weights nor the schedule,
    exactly as a host-side `if` did. The host learns what happened when it reads the
    trainer's `UpdateMeter`. PyTorch's unfused Adam cannot skip on the device: with
    `optim.fused=false` (or a device without the fused kernel) each update reads the
    finite flag back, one read per update.

    Args:
        model: whose parameters are clipped.
        optimizer: `build_optimizer`'s.
        scaler: the GradScaler (disabled outside fp16).
        cfg: clip_norm, lr, warmup_steps.
        device: the training device.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                 cfg: OptimConfig, device: torch.device) -> None:
        self.params = list(model.parameters())  # tied matrices once
        self.optimizer, self.scaler = optimizer, scaler
        self.max_norm = cfg.clip_norm if cfg.clip_norm > 0 else math.inf
        self.peak, self.warmup = cfg.lr, cfg.warmup_steps
        self.on_device = bool(optimizer.defaults.get("fused"))
        # float64 on a CPU: the fused CPU kernel reads the lr as a double, as it reads a
        # Python float; CUDA's fused kernel reads a float32 lr tensor
        lr_dtype = torch.float64 if device.type == "cpu" else torch.float32
        self.applied = torch.zeros((), dtype=torch.float64 if device.type != "mps" else torch.float32,
                                   device=device)  # updates applied: the schedule's step
        self.lr = torch.zeros((), dtype=lr_dtype, device=device)
        self.applied_host = 0  # the unfused path's count (it reads each update)

    def start(self, applied: int, peak: float | None = None) -> None:
        """The count of updates applied so far (a new or resumed run's `TrainState.step`),
        and the peak lr (the schedule's `base_lrs`: `optim.lr`, which a resume puts in place
        of the checkpoint's, `Checkpoints.load`)."""
        if peak is not None:
            self.peak = peak
        self.applied.fill_(applied)
        self.applied_host = applied

    def lr_of(self, update: int) -> float:
        """The lr applied update number `update` (counting from 1) runs with: what the log
        reports beside that update (the schedule's host record is the next update's)."""
        return inverse_sqrt_lr(update, self.peak, self.warmup)

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Clip and step (or skip); returns the gradient norm and whether it was applied
        (0-d device tensors, float and bool), and zeroes the gradients."""
        self.scaler.unscale_(self.optimizer)
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_norm, foreach=True)
        applied = torch.isfinite(norm)
        if self.on_device:
            self._fused_step(applied)
        elif bool(applied):  # a read: the unfused optimizer cannot skip on the device
            self.applied_host += 1
            for group in self.optimizer.param_groups:
                group["lr"] = inverse_sqrt_lr(self.applied_host, self.peak, self.warmup)
            self.optimizer.step()
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return norm, applied

    def _fused_step(self, applied: torch.Tensor) -> None:
        self.lr.copy_(inverse_sqrt_lr_tensor(self.applied + 1, self.peak, self.warmup))
        groups = self.optimizer.param_groups
        host_lrs = [g["lr"] for g in groups]
        for group in groups:
            group["lr"] = self.lr
        self.optimizer.found_inf = (~applied).float()  # 1.0: the kernel leaves everything as it was
        self.optimizer.grad_scale = None  # unscaled already
        try:
            self.optimizer.step()
        finally:
            del self.optimizer.found_inf, self.optimizer.grad_scale
            for group, lr in zip(groups, host_lrs):
                group["lr"] = lr  # the state dict keeps the host's float (`schedule_at`)
        self.applied += applied
