"""The masks of masks.py on the "Mi chiamo Luke" / "My name is Luke" example.

The expected matrices are written out as a reader would draw them: rows are queries,
columns are keys, 1 = may attend. Shapes: B batch, H heads, S source len, T target len.
"""

from __future__ import annotations

import torch

from transformer.config import ModelConfig
from transformer.model.masks import causal_mask, real_key_mask, src_key_mask, tgt_self_mask
from transformer.model.transformer import Transformer

PAD = 0
# The first pair of the batch in docs/masks.md, "Which mask goes where" ("Mi chiamo Luke" /
# "My name is Luke" beside a longer pair), as batching.collate pads it: the source has no
# <s>/</s>, the target input is <s> + y. Ids of mt-masks' whitespace vocabulary.
# [Mi, chiamo, Luke, <pad>, <pad>]
SRC_IDS = torch.tensor([[4, 5, 6, 0, 0]])
# [<s>, My, name, is, Luke, <pad>]
TGT_IDS = torch.tensor([[2, 12, 13, 14, 6, 0]])

# Encoder self-attention: every query may read every real source token; the pad columns
# are closed. The pad query rows are open like the others: their outputs are never read.
ENCODER_SELF = [
    # Mi chiamo Luke <pad> <pad>     <- keys
    [1, 1, 1, 0, 0],  # Mi
    [1, 1, 1, 0, 0],  # chiamo
    [1, 1, 1, 0, 0],  # Luke
    [1, 1, 1, 0, 0],  # <pad>
    [1, 1, 1, 0, 0],  # <pad>
]

# Decoder self-attention: causal triangle AND the target pad column.
DECODER_SELF = [
    # <s> My name is Luke <pad>
    [1, 0, 0, 0, 0, 0],  # <s>
    [1, 1, 0, 0, 0, 0],  # My
    [1, 1, 1, 0, 0, 0],  # name
    [1, 1, 1, 1, 0, 0],  # is
    [1, 1, 1, 1, 1, 0],  # Luke
    [1, 1, 1, 1, 1, 0],  # <pad>
]

# Cross-attention: every target position may read the whole real source, so only the
# source pad columns are closed; there is no triangle.
CROSS = [
    # Mi chiamo Luke <pad> <pad>
    [1, 1, 1, 0, 0],  # <s>
    [1, 1, 1, 0, 0],  # My
    [1, 1, 1, 0, 0],  # name
    [1, 1, 1, 0, 0],  # is
    [1, 1, 1, 0, 0],  # Luke
    [1, 1, 1, 0, 0],  # <pad>
]


def as_drawn(mask: torch.Tensor, t: int, s: int) -> torch.Tensor:
    """Broadcast a (1, 1, *, *) mask to the (T, S) matrix one attention head sees."""
    return mask.expand(1, 1, t, s)[0, 0]


def expected(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.bool)


def test_encoder_self_attention_mask_closes_the_source_pad_column():
    mask = src_key_mask(SRC_IDS, PAD)
    assert mask.dtype == torch.bool
    assert torch.equal(as_drawn(mask, 5, 5), expected(ENCODER_SELF))


def test_decoder_self_attention_mask_is_causal_and_closes_target_pad_columns():
    mask = tgt_self_mask(TGT_IDS, PAD)
    assert mask.dtype == torch.bool
    assert torch.equal(as_drawn(mask, 6, 6), expected(DECODER_SELF))


def test_cross_attention_mask_closes_only_the_source_pad_column_with_no_triangle():
    # The model reuses the source key mask for cross-attention (model.py, decode).
    mask = src_key_mask(SRC_IDS, PAD)
    assert torch.equal(as_drawn(mask, 6, 5), expected(CROSS))


def test_mask_shapes_broadcast_against_scores():
    b, h, s, t = 3, 4, 6, 8
    src = torch.randint(1, 30, (b, s))
    tgt = torch.randint(1, 30, (b, t))
    assert real_key_mask(src, PAD).shape == (b, 1, 1, s)
    assert src_key_mask(src, PAD).shape == (b, 1, 1, s)
    assert causal_mask(t).shape == (1, 1, t, t)
    assert tgt_self_mask(tgt, PAD).shape == (b, 1, t, t)
    # encoder self (B,H,S,S), decoder self (B,H,T,T), cross (B,H,T,S)
    assert torch.broadcast_shapes(src_key_mask(src, PAD).shape, (b, h, s, s)) == (b, h, s, s)
    assert torch.broadcast_shapes(tgt_self_mask(tgt, PAD).shape, (b, h, t, t)) == (b, h, t, t)
    assert torch.broadcast_shapes(src_key_mask(src, PAD).shape, (b, h, t, s)) == (b, h, t, s)


def test_masks_follow_each_row_of_a_batch():
    src = torch.tensor([[5, 6, 7, 0], [5, 0, 0, 0]])
    assert real_key_mask(src, PAD)[:, 0, 0].tolist() == [
        [True, True, True, False],
        [True, False, False, False],
    ]


def test_the_model_puts_each_mask_on_its_attention():
    """Stored attention weights of every layer are zero exactly where the drawn mask is 0."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=32, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=2,
                      n_decoder_layers=2, dropout=0.0, attn_dropout=0.0, max_positions=16)
    model = Transformer(cfg).eval()
    attns = {"enc": [], "self": [], "cross": []}
    for layer in model.encoder_layers:
        attns["enc"].append(layer.self_attn)
    for layer in model.decoder_layers:
        attns["self"].append(layer.self_attn)
        attns["cross"].append(layer.cross_attn)
    for module in (m for ms in attns.values() for m in ms):
        module.store_weights = True
    with torch.no_grad():
        model(SRC_IDS, TGT_IDS)
    drawn = {"enc": ENCODER_SELF, "self": DECODER_SELF, "cross": CROSS}
    for kind, modules in attns.items():
        allowed = expected(drawn[kind])
        for module in modules:
            w = module.weights[0]  # (H, T, S)
            assert w.shape[1:] == allowed.shape
            assert torch.all(w[:, ~allowed] == 0), kind
            assert torch.all(w[:, allowed] > 0), kind
            torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:2]))


def test_incremental_rows_are_the_last_rows_of_the_full_decoder_mask():
    """Cached decoding asks for the rows of the new positions only: they must be exactly
    the last rows of the full causal-and-padding mask."""
    tgt = torch.tensor([[2, 5, 6, 7, 0, 0], [2, 8, 9, 10, 11, 12]])
    full = tgt_self_mask(tgt, pad_id=0)
    for n in range(1, tgt.size(1) + 1):
        assert torch.equal(tgt_self_mask(tgt, pad_id=0, n_queries=n), full[:, :, -n:, :])
