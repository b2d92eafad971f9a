"""Dropout whose mask is cheap to draw on a CPU.

PyTorch's CPU dropout draws one Mersenne-Twister number per element, a large share of a
small model's bf16 training step on a CPU (docs/results/training-speed.md, "Why the step is built
so", has it timed). Here one 64-bit word serves four elements: each 16-bit
lane is a uniform integer in [-32768, 32767], kept when it is at least
-32768 + round(p * 65536). So p is applied with a resolution of 1/65536, and the kept
elements are scaled by 1 / (1 - p) as usual. The words come from numpy's SFC64 generator
(faster than torch's Mersenne Twister, the same page), seeded for each mask by one draw from
torch's default generator, so `torch.manual_seed` and the trainer's saved RNG state
govern them: seeding and resuming work as with `nn.Dropout`. On other devices this is
`F.dropout` (fused and fast there).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def _lanes(n: int) -> np.ndarray:
    """n uniform int16s, four to each 64-bit word of a generator seeded from torch's."""
    seed = int(torch.randint(0, 2**62, (1,)))  # from torch's generator: seeding works as usual
    return np.random.SFC64(seed).random_raw((n + 3) // 4).view(np.int16)[:n]


def _threshold(p: float) -> int:
    return -32768 + round(p * 65536)


def keep_mask(shape: torch.Size, p: float) -> torch.Tensor:
    """Bool tensor of `shape`, each element True with probability 1 - p (to 1/65536)."""
    return torch.from_numpy(_lanes(shape.numel()) >= _threshold(p)).view(shape)


def keep_factor(shape: torch.Size, p: float, dtype: torch.dtype) -> torch.Tensor:
    """The same draw as `keep_mask`, as 1.0 (keep) and 0.0 (drop) in `dtype`.

    Multiplying by a bool tensor converts it to the other operand's dtype first, on a
    slow path (docs/results/training-speed.md, "Why the step is built so", has it timed):
    numpy writes the factor in the dtype itself, bf16 as the bit pattern of 1.0 (0x3F80).
    """
    keep = _lanes(shape.numel()) >= _threshold(p)
    if dtype == torch.bfloat16:
        bits = keep.view(np.uint8).astype(np.int16) * np.int16(0x3F80)
        return torch.from_numpy(bits).view(torch.bfloat16).view(shape)
    if dtype == torch.float32:
        return torch.from_numpy(keep.astype(np.float32)).view(shape)
    return torch.from_numpy(keep).view(shape).to(dtype)


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0 or torch.compiler.is_compiling():
        # numpy's generator cannot be traced: a compiled graph draws its own mask
        return F.dropout(x, p, training)
    return x.mul(keep_factor(x.shape, p, x.dtype)).mul_(1.0 / (1.0 - p))  # in place: one tensor less


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
