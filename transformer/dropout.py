"""Dropout whose mask is cheap to draw on a CPU.

PyTorch's CPU dropout draws one Mersenne-Twister number per element, which made dropout
about 30% of a bf16 training step of the small model on a 2-core CPU (profiled in
scripts/bench_train.py's setting). Here one 64-bit word serves four elements: each 16-bit
lane is a uniform integer in [-32768, 32767], kept when it is at least
-32768 + round(p * 65536). So p is applied with a resolution of 1/65536, and the kept
elements are scaled by 1 / (1 - p) as usual. The words come from numpy's SFC64 generator
(about 2.5x faster than torch's Mersenne Twister), seeded for each mask by one draw from
torch's default generator, so `torch.manual_seed` and the trainer's saved RNG state
govern them: seeding and resuming work as with `nn.Dropout`. On other devices this is
`F.dropout` (fused and fast there).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def keep_mask(shape: torch.Size, p: float) -> torch.Tensor:
    """Bool tensor of `shape`, each element True with probability 1 - p (to 1/65536)."""
    n = shape.numel()
    seed = int(torch.randint(0, 2**62, (1,)))  # from torch's generator: seeding works as usual
    words = np.random.SFC64(seed).random_raw((n + 3) // 4).view(np.int64)
    lanes = torch.from_numpy(words).view(torch.int16)[:n].view(shape)  # 4 uniform 16-bit integers per word
    return lanes >= -32768 + round(p * 65536)


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0 or torch.compiler.is_compiling():
        # numpy's generator cannot be traced: a compiled graph draws its own mask
        return F.dropout(x, p, training)
    return x.mul(keep_mask(x.shape, p)).mul_(1.0 / (1.0 - p))  # in place: one tensor less


class Dropout(nn.Module):
    """Drop-in `nn.Dropout` (same `p`, train/eval behaviour) with a cheap CPU mask."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
