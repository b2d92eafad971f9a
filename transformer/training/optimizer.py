"""Adam and the inverse-square-root warm-up schedule of Vaswani et al. (2017), section 5.3."""

from __future__ import annotations

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


def build_optimizer(model: nn.Module, cfg: OptimConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW (= Adam when weight_decay is 0); the fused kernel when `cfg.fused`.

    Fused, one kernel updates every parameter (CUDA, and CPU since torch 2.4); unfused,
    PyTorch's CPU default is a loop of about ten small ops per parameter tensor, 5% of a
    small model's bf16 step on a 2-core CPU (scripts/bench_train.py's profile).
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
