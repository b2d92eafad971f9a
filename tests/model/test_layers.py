"""model/layers.py: the paper's building blocks one at a time: the sinusoid table
(section 3.5), the position-wise FFN (3.3), post- and pre-norm residuals (5.4), and the
encoder and decoder layers' padding invariance and causality (3.1).

Shapes: B batch, S source length, T target length, D d_model.
"""

from __future__ import annotations

import math

import pytest
import torch

from transformer.model.layers import (
    DecoderLayer,
    EncoderLayer,
    FeedForward,
    Residual,
    sinusoid_table,
)
from transformer.model.masks import causal_mask, src_key_mask

D, H, FF = 16, 4, 32
ATOL = 1e-5


def test_the_sinusoid_table_is_the_papers():
    table = sinusoid_table(50, D)  # (50, D)
    for pos in (0, 1, 7, 49):
        for i in range(D // 2):
            angle = pos / 10000 ** (2 * i / D)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)


def test_the_ffn_acts_on_each_position_alone():
    torch.manual_seed(0)
    ffn = FeedForward(D, FF, dropout=0.0)
    x = torch.randn(2, 5, D)
    y = x.clone()
    y[:, 3] = torch.randn(2, D)  # another vector at one position
    changed = (ffn(x) - ffn(y)).abs().amax(dim=(0, 2))  # (5,)
    assert changed[3] > 0 and torch.all(changed[[0, 1, 2, 4]] == 0)


@pytest.mark.parametrize("pre_norm", [False, True], ids=["post-norm", "pre-norm"])
def test_a_residual_is_layernorm_after_the_sum_or_before_the_sublayer(pre_norm):
    torch.manual_seed(0)
    res = Residual(D, dropout=0.0, pre_norm=pre_norm)
    x = torch.randn(3, 4, D) * 5 + 2
    double = lambda h: 2 * h  # noqa: E731
    norm = torch.nn.functional.layer_norm
    want = x + 2 * norm(x, (D,)) if pre_norm else norm(x + 2 * x, (D,))
    torch.testing.assert_close(res(x, double), want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("pre_norm", [False, True], ids=["post-norm", "pre-norm"])
def test_appending_padding_changes_no_real_output_of_the_encoder_layer(pre_norm):
    torch.manual_seed(0)
    layer = EncoderLayer(D, H, FF, 0.0, 0.0, 0.0, pre_norm).eval()
    ids = torch.tensor([[5, 6, 7, 8]])
    padded = torch.tensor([[5, 6, 7, 8, 0, 0, 0]])
    x = torch.randn(1, 7, D)
    short = layer(x[:, :4], src_key_mask(ids, 0))  # (1, 4, D)
    long = layer(x, src_key_mask(padded, 0))  # (1, 7, D): the pad positions hold anything
    torch.testing.assert_close(long[:, :4], short, atol=ATOL, rtol=0)


@pytest.mark.parametrize("pre_norm", [False, True], ids=["post-norm", "pre-norm"])
def test_the_decoder_layer_is_causal_and_reads_only_real_memory(pre_norm):
    torch.manual_seed(0)
    layer = DecoderLayer(D, H, FF, 0.0, 0.0, 0.0, pre_norm).eval()
    x, memory = torch.randn(1, 6, D), torch.randn(1, 5, D)
    src_mask = src_key_mask(torch.tensor([[4, 5, 6, 0, 0]]), 0)  # (1, 1, 1, S): two pad keys
    out = layer(x, memory, causal_mask(6), src_mask)  # (1, T, D)
    later = x.clone()
    later[:, 4:] = torch.randn(1, 2, D)  # other tokens from position 4 on
    torch.testing.assert_close(layer(later, memory, causal_mask(6), src_mask)[:, :4], out[:, :4],
                               atol=ATOL, rtol=0)
    other_pads = memory.clone()
    other_pads[:, 3:] = torch.randn(1, 2, D)  # what the pad positions hold is never read
    torch.testing.assert_close(layer(x, other_pads, causal_mask(6), src_mask), out, atol=ATOL, rtol=0)
