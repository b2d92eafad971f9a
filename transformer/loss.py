"""Label-smoothed cross-entropy (Szegedy et al. 2016; Vaswani et al. 2017, section 5.4).

Shapes: N tokens, V vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def label_smoothed_nll(
    logits: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed smoothed loss and summed NLL over the non-ignored targets.

    logits (..., V), target (...). The smoothed target puts 1 - epsilon on the gold token
    and spreads epsilon uniformly over the whole vocabulary (as fairseq does), so
    loss = (1 - eps) * nll + eps * mean_v(-log p_v). Padding targets contribute nothing.
    Computed in fp32 whatever the logits' dtype. Returns (loss_sum, nll_sum).
    """
    lprobs = F.log_softmax(logits.float(), dim=-1).flatten(0, -2)  # (N, V)
    target = target.flatten()  # (N,)
    keep = target != ignore_index
    nll = -lprobs.gather(1, target.clamp(min=0)[:, None]).squeeze(1)  # (N,)
    smooth = -lprobs.mean(dim=-1)  # (N,)
    nll_sum = nll.masked_fill(~keep, 0.0).sum()
    smooth_sum = smooth.masked_fill(~keep, 0.0).sum()
    return (1.0 - epsilon) * nll_sum + epsilon * smooth_sum, nll_sum
