"""`weights.held_in`: a model decodes on copies of its weights in another dtype for a
block, and gets its own back untouched (tied weights stay tied)."""

from __future__ import annotations

import torch

from transformer.model.weights import floating_dtype, held_in

from helpers import tiny_model


def test_held_in_swaps_the_weights_for_the_block_and_puts_them_back():
    model = tiny_model(tie_embeddings=True)
    before = {name: p for name, p in model.named_parameters()}
    values = {name: p.detach().clone() for name, p in before.items()}
    with held_in(model, torch.bfloat16):
        assert floating_dtype(model) == torch.bfloat16
        assert model.sinusoids.dtype == torch.bfloat16
        assert model.tgt_embed.weight is model.out_proj.weight  # still tied
    assert floating_dtype(model) == torch.float32 and model.sinusoids.dtype == torch.float32
    for name, p in model.named_parameters():
        assert p is before[name] and torch.equal(p, values[name])
