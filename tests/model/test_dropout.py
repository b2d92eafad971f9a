"""The cheap CPU dropout keeps 1 - p of the elements, unbiased, and behaves like nn.Dropout."""

import pytest
import torch

from transformer.model.dropout import Dropout, keep_factor, keep_mask


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_keep_rate_is_one_minus_p_and_lanes_are_independent(p):
    torch.manual_seed(0)
    keep = keep_mask(torch.Size([1000, 1000]), p).float()
    assert abs(keep.mean().item() - (1 - p)) < 3e-3  # 1e6 draws: sd ~ 5e-4
    # The 4 elements sharing one 64-bit draw are independent: no correlation between lanes.
    lanes = keep.view(-1, 4)
    corr = torch.corrcoef(lanes.T)
    assert (corr - torch.eye(4)).abs().max() < 0.01


def test_expectation_is_preserved_and_dropped_elements_are_exactly_zero():
    torch.manual_seed(0)
    x = torch.rand(500, 1000) + 0.5
    y = Dropout(0.2).train()(x)
    dropped = y == 0
    assert abs(dropped.float().mean().item() - 0.2) < 3e-3
    torch.testing.assert_close(y[~dropped], x[~dropped] / 0.8)
    assert abs(y.mean().item() / x.mean().item() - 1) < 5e-3


def test_eval_mode_and_p_zero_are_the_identity_and_p_one_drops_everything():
    x = torch.randn(8, 16)
    assert Dropout(0.3).eval()(x) is x
    assert Dropout(0.0).train()(x) is x
    assert torch.equal(Dropout(1.0).train()(x), torch.zeros_like(x))


def test_seeded_masks_repeat_and_gradients_follow_the_mask():
    x = torch.randn(64, 32, requires_grad=True)
    torch.manual_seed(3)
    y1 = Dropout(0.25).train()(x)
    torch.manual_seed(3)
    y2 = Dropout(0.25).train()(x)
    assert torch.equal(y1, y2)
    y1.sum().backward()
    torch.testing.assert_close(x.grad, (y1 != 0).float() / 0.75)


def test_bf16_inputs_stay_bf16():
    x = torch.randn(32, 32, dtype=torch.bfloat16)
    assert Dropout(0.1).train()(x).dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_the_factor_in_the_inputs_dtype_is_the_same_draw_as_the_bool_mask(dtype):
    """Dropout multiplies by a 1/0 factor written in the input's dtype (bf16 as its bit
    pattern): it must be exactly the bool mask's draw from the same seed."""
    shape = torch.Size([7, 13, 33])  # not a multiple of 4 elements
    torch.manual_seed(3)
    mask = keep_mask(shape, 0.2)
    torch.manual_seed(3)
    factor = keep_factor(shape, 0.2, dtype)
    assert factor.dtype == dtype and factor.shape == shape
    assert torch.equal(factor, mask.to(dtype))
