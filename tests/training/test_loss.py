"""The fused label-smoothed cross-entropy of loss.py against PyTorch's own, and the
model's `positions` argument that feeds it only the real target positions.

Shapes: N tokens, V vocabulary.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from transformer.decoding.search import logsumexp
from transformer.training.loss import label_smoothed_nll

from helpers import PAD, pad_batch, tiny_model

V = 11


def reference(logits, target, eps, ignore_index=PAD):
    """PyTorch's cross-entropy with label smoothing: the same definition (eps spread over
    all V classes), summed over non-ignored targets; and the plain NLL."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    loss = F.cross_entropy(logits, target, ignore_index=ignore_index, label_smoothing=eps, reduction="sum")
    nll = F.cross_entropy(logits, target, ignore_index=ignore_index, reduction="sum")
    return loss, nll


def sample(n: int, seed: int = 0, dtype=torch.float64, pad_every: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(n, V, generator=g)).to(dtype).requires_grad_()
    target = torch.randint(1, V, (n,), generator=g)
    if pad_every:
        target[::pad_every] = PAD
    return logits, target


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("pad_every", [0, 3])
def test_loss_nll_and_gradient_equal_pytorch_cross_entropy(eps, pad_every):
    logits, target = sample(20, pad_every=pad_every)
    loss, nll = label_smoothed_nll(logits, target, eps, PAD)
    (grad,) = torch.autograd.grad(loss, logits)
    ref_loss, ref_nll = reference(logits, target, eps)
    (ref_grad,) = torch.autograd.grad(ref_loss, logits)
    torch.testing.assert_close(loss, ref_loss.to(loss.dtype))
    torch.testing.assert_close(nll, ref_nll.to(nll.dtype))
    torch.testing.assert_close(grad, ref_grad)
    if pad_every:  # padded rows get exactly no gradient
        assert grad[target == PAD].abs().max() == 0


def test_gradcheck_in_double():
    logits, target = sample(6, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda x: label_smoothed_nll(x, target, 0.1, PAD)[0], (logits,))


def test_nll_carries_no_gradient_and_eps_zero_gives_loss_equal_nll():
    logits, target = sample(8)
    loss, nll = label_smoothed_nll(logits, target, 0.0, PAD)
    assert not nll.requires_grad
    torch.testing.assert_close(loss, nll)


def test_bf16_logits_are_scored_in_fp32_and_get_a_bf16_gradient():
    logits, target = sample(32, dtype=torch.bfloat16)
    loss, _ = label_smoothed_nll(logits, target, 0.1, PAD)
    assert loss.dtype == torch.float32
    (grad,) = torch.autograd.grad(loss, logits)
    assert grad.dtype == torch.bfloat16
    exact = logits.detach().double().requires_grad_()  # the same bf16 values, scored in fp64
    ref_loss, _ = reference(exact, target, 0.1)
    (ref_grad,) = torch.autograd.grad(ref_loss, exact)
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(grad.double(), ref_grad, rtol=1e-2, atol=1e-2)  # bf16 rounding


def test_extra_padding_rows_change_nothing():
    logits, target = sample(10, dtype=torch.float32)
    padded_logits = torch.cat([logits, 50 * torch.randn(4, V)])
    padded_target = torch.cat([target, torch.full((4,), PAD)])
    torch.testing.assert_close(label_smoothed_nll(logits, target, 0.1, PAD),
                               label_smoothed_nll(padded_logits, padded_target, 0.1, PAD))


def test_all_padding_gives_zero_loss_not_nan():
    logits, _ = sample(4)
    loss, nll = label_smoothed_nll(logits, torch.full((4,), PAD), 0.1, PAD)
    assert loss.item() == 0.0 and nll.item() == 0.0


def test_forward_with_a_predict_mask_gives_the_same_logits_as_the_full_output():
    model = tiny_model()
    src = pad_batch([[5, 6, 7, 8], [9, 10]])
    tgt = pad_batch([[2, 11, 12], [2, 13]])
    real = tgt != PAD
    full = model(src, tgt)  # (B, T, V)
    selected = model(src, tgt, real)  # (N, V)
    assert selected.shape == (int(real.sum()), full.size(-1))
    torch.testing.assert_close(selected, full[real])
    with pytest.raises(ValueError, match="predict_mask must be a bool tensor"):
        model(src, tgt, real.long())


def test_logsumexp_matches_torch_on_flat_and_very_peaked_rows():
    x = torch.cat([torch.randn(3, V), 200 * torch.randn(3, V)]).double()  # exp underflows in the second half
    torch.testing.assert_close(logsumexp(x), torch.logsumexp(x, dim=-1))


@pytest.mark.parametrize("scale", [3.0, 40.0], ids=["spread", "confident"])
def test_bf16_logits_give_the_fp32_loss_and_a_bf16_gradient(scale):
    """Training's case: bf16 logits from the autocast output layer. The loss is computed in
    fp32 from them (the same as the fp32 reference on the same values), the gradient comes
    back in bf16, rounded from an fp32 one; a confident model's logits (most
    log-probabilities far below exp's normal range) change nothing."""
    g = torch.Generator().manual_seed(0)
    x = (scale * torch.randn(64, 500, generator=g)).to(torch.bfloat16).requires_grad_()
    target = torch.randint(1, 500, (64,), generator=g)
    loss, nll = label_smoothed_nll(x, target, 0.1, PAD)
    (grad,) = torch.autograd.grad(loss, x)
    ref_x = x.detach().float().requires_grad_()
    ref_loss, ref_nll = reference(ref_x, target, 0.1)
    (ref_grad,) = torch.autograd.grad(ref_loss, ref_x)
    assert loss.dtype == torch.float32 and grad.dtype == torch.bfloat16
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(nll, ref_nll, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(grad, ref_grad.to(torch.bfloat16))  # bf16's own tolerance: an ulp
