"""Properties of attention.py: masked keys get zero weight, rows sum to one, empty rows
give zeros (never NaN) in every dtype, and the fused and explicit paths agree.

Shapes: B batch, H heads, T query len, S key len, D d_model, Dh head dim.
"""

from __future__ import annotations

import pytest
import torch

from transformer.inspection.mask_inspector import masking_methods
from transformer.model.attention import MultiHeadAttention, attention_weights

B, H, T, S, D = 2, 4, 5, 6, 16


def padded_mask() -> torch.Tensor:
    """(B, 1, 1, S): row 0 has 4 real keys, row 1 has none (an all-padding sequence)."""
    mask = torch.zeros(B, 1, 1, S, dtype=torch.bool)
    mask[0, ..., :4] = True
    return mask


def qk(seed: int = 0, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, D // H, generator=g).to(dtype)
    k = torch.randn(B, H, S, D // H, generator=g).to(dtype)
    return q, k


def mha(seed: int = 0) -> MultiHeadAttention:
    torch.manual_seed(seed)
    return MultiHeadAttention(D, H).eval()


def inputs(seed: int = 1, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, D, generator=g).to(dtype), torch.randn(B, S, D, generator=g).to(dtype)


# --- why the mask is added to the scores -------------------------------------------------

# One query, three keys with scores (0, -1, 5); key 2 is padding. Dh = 1, so q k^T = scores.
SCORES = torch.tensor([0.0, -1.0, 5.0])
KEEP = torch.tensor([1.0, 1.0, 0.0])


def test_the_manuals_table_of_the_three_masking_methods():
    """docs/masks.md, "Why add −∞ to the scores": the rows mt-masks prints
    (mask_inspector.masking_methods), with the model's way checked against attention.py
    itself."""
    m = masking_methods(SCORES, KEEP.bool())
    # softmax, then multiply: the pad key held 99% of the weight; what is left sums to 0.009
    # and the real keys keep their tiny unscaled weights
    torch.testing.assert_close(m.softmax_then_multiply, torch.tensor([0.0067, 0.0025, 0.0]), atol=5e-5, rtol=0)
    assert m.softmax_then_multiply.sum() < 0.01
    # multiply the scores: the pad score becomes 0, e^0 = 1, and it outweighs a real key
    torch.testing.assert_close(m.multiply_then_softmax, torch.tensor([0.42, 0.16, 0.42]), atol=5e-3, rtol=0)
    assert m.multiply_then_softmax[2] > m.multiply_then_softmax[1]
    # add -inf: exactly the softmax over the real keys, as attention.py computes it
    torch.testing.assert_close(m.add_neg_inf, torch.tensor([0.73, 0.27, 0.0]), atol=5e-3, rtol=0)
    model_way = attention_weights(torch.ones(1, 1, 1, 1), SCORES.view(1, 1, 3, 1), KEEP.bool().view(1, 1, 1, 3))
    torch.testing.assert_close(model_way[0, 0, 0], m.add_neg_inf)


def test_additive_mask_gives_the_softmax_over_the_real_keys_only():
    q = torch.ones(1, 1, 1, 1)
    k = SCORES.view(1, 1, 3, 1)
    w = attention_weights(q, k, KEEP.bool().view(1, 1, 1, 3))[0, 0, 0]
    assert w[2] == 0
    torch.testing.assert_close(w.sum(), torch.tensor(1.0))
    torch.testing.assert_close(w[:2], SCORES[:2].softmax(-1))  # about (0.731, 0.269)


# --- attention_weights and the store_weights path ----------------------------------------


def test_masked_keys_get_exactly_zero_weight_and_rows_sum_to_one():
    q, k = qk()
    mask = padded_mask() & torch.ones(T, S, dtype=torch.bool).tril()  # causal as well
    w = attention_weights(q, k, mask)
    assert w.shape == (B, H, T, S)
    full = mask.expand(B, H, T, S)
    assert torch.all(w[~full] == 0)
    has_key = full.any(-1)
    torch.testing.assert_close(w.sum(-1)[has_key], torch.ones(int(has_key.sum())))
    assert torch.all(w.sum(-1)[~has_key] == 0)  # the all-padding row: zeros


def test_store_weights_path_keeps_weights_with_the_same_properties():
    module = mha()
    module.store_weights = True
    x, kv = inputs()
    module(x, kv, padded_mask())
    w = module.weights
    assert w.shape == (B, H, T, S)
    assert torch.all(w[0, ..., 4:] == 0)
    torch.testing.assert_close(w[0].sum(-1), torch.ones(H, T))
    assert torch.all(w[1] == 0)


def test_all_padding_sequence_gives_finite_outputs_and_zeros_from_attention():
    module = mha()
    x, kv = inputs()
    out = module(x, kv, padded_mask())
    assert torch.isfinite(out).all()
    # The attention output of the empty row is zero, so only out_proj's bias remains.
    torch.testing.assert_close(out[1], module.out_proj.bias.expand(T, D))


def test_fused_and_explicit_paths_agree():
    module = mha()
    x, kv = inputs()
    mask = padded_mask() & torch.ones(T, S, dtype=torch.bool).tril()
    module.use_sdpa = True  # the CUDA path, run here on CPU
    fused = module(x, kv, mask)
    module.use_sdpa = False
    explicit = module(x, kv, mask)
    torch.testing.assert_close(fused, explicit, atol=1e-6, rtol=1e-5)
    module.store_weights = True  # explicit, keeping the weights
    torch.testing.assert_close(module(x, kv, mask), explicit, atol=0, rtol=0)


def test_cpu_uses_the_explicit_path_unless_told(monkeypatch):
    module = mha()
    x, kv = inputs()
    calls = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *args, **kwargs: calls.append(1) or real_sdpa(*args, **kwargs))
    module(x, kv, padded_mask())
    assert not calls
    module.use_sdpa = True
    module(x, kv, padded_mask())
    assert calls


@pytest.mark.parametrize("use_sdpa", [False, True])
def test_no_nan_under_bf16_autocast(use_sdpa):
    module = mha()
    module.use_sdpa = use_sdpa
    x, kv = inputs()
    for store in (False, True):
        module.store_weights = store
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = module(x, kv, padded_mask())
        assert torch.isfinite(out).all(), f"store_weights={store}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("use_sdpa", [False, True])
def test_all_masked_row_gives_zeros_not_nan_in_half_precision(dtype, use_sdpa):
    module = mha().to(dtype)
    module.use_sdpa = use_sdpa
    store_weights = not use_sdpa
    module.store_weights = store_weights
    x, kv = inputs(dtype=dtype)
    try:
        out = module(x, kv, padded_mask())
    except (RuntimeError, NotImplementedError) as err:  # an op without a CPU kernel
        if "not implemented" in str(err).lower():
            pytest.skip(f"{dtype} not supported on CPU: {err}")
        raise
    assert out.dtype == dtype
    assert torch.isfinite(out).all()
    assert torch.equal(out[1], module.out_proj.bias.expand(T, D))
    if store_weights:
        assert torch.all(module.weights[1] == 0)


def test_finfo_min_fill_does_not_overflow_in_half_precision():
    """The explicit path fills masked scores with finfo.min: finite in every dtype, still masks."""
    for dtype in (torch.float16, torch.bfloat16):
        q, k = qk(dtype=dtype)
        try:
            w = attention_weights(q, k, padded_mask())
        except (RuntimeError, NotImplementedError) as err:
            if "not implemented" in str(err).lower():
                continue
            raise
        assert torch.isfinite(w).all()
        assert torch.all(w[0, ..., 4:] == 0)
