"""Label-smoothed cross-entropy (Szegedy et al. 2016; Vaswani et al. 2017, section 5.4).

Shapes: N tokens, V vocabulary.

The smoothed target puts 1 - eps on the gold token and spreads eps uniformly over the
whole vocabulary (as fairseq does), so per token

    loss = (1 - eps) * nll + eps * mean_v(-log p_v),   -log p_v = lse - x_v,

where x are the logits and lse = logsumexp(x). Its gradient is softmax(x) - eps / V
- (1 - eps) * onehot(gold). `label_smoothed_nll` computes both in one autograd function,
in fp32 (or fp64) whatever the logits' dtype, keeping only the logits for the backward
pass: the output layer and this loss are the largest cost of a training step at an 8k
vocabulary (profiled in scripts/bench/bench_train.py). The passes over the (N, V) logits:
forward a log_softmax in fp32 (the sums, the gold token and the mean come from it),
backward a softmax, a subtraction and the multiplication by the incoming gradient written
straight into the logits' dtype. For bf16 logits, eager PyTorch's `log_softmax(...,
dtype=float32)` and `softmax(..., dtype=float32)` first copy them to fp32 inside the op
(their kernels upcast in the read for fp16 only); a compiled step fuses that cast into the
read. Taking exp by hand would make seven passes (docs/results/training-speed.md, "Why
the step is built so", times both).
"""

from __future__ import annotations

import torch

from transformer.data.batching import Batch
from transformer.device import autocast


class _LabelSmoothedCE(torch.autograd.Function):
    """(logits (N, V), target (N,), eps) -> (summed loss, summed nll); target has no padding."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, epsilon: float):
        acc = torch.promote_types(logits.dtype, torch.float32)
        logp = torch.log_softmax(logits, dim=-1, dtype=acc)  # (N, V): x - lse
        nll_sum = -logp.gather(1, target[:, None]).sum()
        smooth_sum = -logp.mean(dim=-1).sum()
        ctx.save_for_backward(logits, target)
        ctx.epsilon, ctx.acc = epsilon, acc
        ctx.mark_non_differentiable(nll_sum)
        return (1.0 - epsilon) * nll_sum + epsilon * smooth_sum, nll_sum

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_nll: torch.Tensor):
        logits, target = ctx.saved_tensors
        eps = ctx.epsilon
        grad = torch.softmax(logits, dim=-1, dtype=ctx.acc)  # (N, V), one new buffer
        grad.sub_(eps / grad.size(-1))
        grad.scatter_add_(1, target[:, None], grad.new_full((target.numel(), 1), eps - 1.0))
        out = torch.empty_like(logits)  # the scaling writes the logits' dtype directly
        torch.mul(grad, grad_loss.to(ctx.acc), out=out)
        return out, None, None


def label_smoothed_nll(
    logits: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed smoothed loss and summed NLL over the non-ignored targets.

    logits (..., V), target (...): padding targets (`ignore_index`) contribute nothing;
    dropping them reads the mask back to the host, so a caller whose targets hold no
    padding (training: `batch_loss`) passes `ignore_index=None` and nothing is read.
    Computed in fp32 whatever the logits' dtype. Returns (loss_sum, nll_sum); nll_sum
    carries no gradient.
    """
    logits = logits.flatten(0, -2)  # (N, V)
    target = target.flatten()  # (N,)
    if ignore_index is not None:
        keep = target != ignore_index
        if not bool(keep.all()):
            logits, target = logits[keep], target[keep]
    return _LabelSmoothedCE.apply(logits, target, epsilon)


def batch_loss(net: torch.nn.Module, batch: Batch, label_smoothing: float, precision: str,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed loss and NLL of a batch (teacher forcing), as training computes it.

    The model runs under `precision`'s autocast and projects onto the vocabulary only the
    non-padding target positions, `batch.predict_index` (computed on the host by
    `collate`): nothing in here reads the device. The loss is computed in fp32.
    """
    index = batch.predict_index  # (N,)
    with autocast(precision, device):
        logits = net(batch.src_ids, batch.tgt_in_ids, predict_index=index)  # (N, V)
    target = batch.tgt_out_ids.flatten().index_select(0, index)  # (N,), no padding
    return label_smoothed_nll(logits, target, label_smoothing, None)
