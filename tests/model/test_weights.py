"""`weights.held_in`: a model decodes on copies of its weights in another dtype for a
block, and gets its own back untouched (tied weights stay tied); `DtypeCopies` makes a
model's copy in a dtype once, from its originals where its weights are their rounding."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from transformer.model.weights import DtypeCopies, floating_dtype, held_in, rounds_to

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


def test_rounds_to_tells_a_models_rounding_from_another_models():
    model = tiny_model(seed=1)
    rounded = tiny_model(seed=1).to(torch.bfloat16)
    assert rounds_to(model, rounded) and rounds_to(model, tiny_model(seed=1))
    assert not rounds_to(tiny_model(seed=2), rounded)
    with torch.no_grad():
        rounded.out_proj.weight[0, 0] += 1.0
    assert not rounds_to(model, rounded)


def test_dtype_copies_are_made_once_from_the_originals_while_the_weights_stay(monkeypatch):
    """Threads that ask at once get one copy; a rounded model's copies come from its
    originals until its weights change, then from its own weights."""
    from transformer.model import weights

    exact = tiny_model(seed=1)
    held = tiny_model(seed=1).to(torch.bfloat16)
    read, copied = [], []
    real = weights.copied_in
    monkeypatch.setattr(weights, "copied_in", lambda m, d: copied.append(d) or real(m, d))

    def originals(dtype):
        read.append(dtype)
        return tiny_model(seed=1).to(dtype)

    copies = DtypeCopies(held, originals)
    assert copies.get(torch.bfloat16) is held and read == []
    with ThreadPoolExecutor(4) as pool:
        found = list(pool.map(lambda _: copies.get(torch.float32), range(8)))
    assert all(f is found[0] for f in found) and read == [torch.float32] and copied == []
    assert rounds_to(found[0], exact) and rounds_to(exact, found[0])  # the originals, not a cast
    with torch.no_grad():
        held.out_proj.weight.mul_(2.0)  # the model's own weights now
    changed = copies.get(torch.float32)
    assert changed is not found[0] and read == [torch.float32] and copied == [torch.float32]
    assert torch.equal(changed.out_proj.weight, held.out_proj.weight.float())
