"""Properties of the Transformer in model.py: padding invariance, causality, what
cross-attention reads, cached decoding, input checks, tying, init, and learning a copy task.

Shapes: B batch, S source len, T target len, D d_model, V vocab.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F

from transformer.config import ModelConfig
from transformer.model.attention import set_attention_path
from transformer.model.transformer import DecoderCache, Transformer

from helpers import BOS, EOS, PAD, pad_batch, tiny_model
from helpers import TINY_V as V

ATOL = 1e-5


def random_ids(g: torch.Generator, length: int) -> list[int]:
    return torch.randint(4, V, (length,), generator=g).tolist()


# Three sentences of different lengths on both sides.
G = torch.Generator().manual_seed(1)
SRC = [[*random_ids(G, n), EOS] for n in (6, 3, 4)]
TGT = [[BOS, *random_ids(G, n)] for n in (4, 6, 2)]


# --- padding invariance ------------------------------------------------------------------


@pytest.mark.parametrize("pre_norm", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("extra", [1, 5])
def test_appending_source_padding_changes_no_real_output(pre_norm, extra):
    model = tiny_model(pre_norm)
    src, tgt = pad_batch(SRC), pad_batch(TGT)
    more_src = F.pad(src, (0, extra), value=PAD)
    with torch.no_grad():
        memory, more_memory = model.encode(src), model.encode(more_src)
        real = src != PAD
        torch.testing.assert_close(more_memory[:, : src.size(1)][real], memory[real],
                                   atol=ATOL, rtol=0)
        logits, more_logits = model(src, tgt), model(more_src, tgt)
    real_tgt = tgt != PAD
    torch.testing.assert_close(more_logits[real_tgt], logits[real_tgt], atol=ATOL, rtol=0)


@pytest.mark.parametrize("pre_norm", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("extra", [1, 5])
def test_appending_target_padding_changes_no_real_output(pre_norm, extra):
    model = tiny_model(pre_norm)
    src, tgt = pad_batch(SRC), pad_batch(TGT)
    more_tgt = F.pad(tgt, (0, extra), value=PAD)
    with torch.no_grad():
        logits, more_logits = model(src, tgt), model(src, more_tgt)
    real = tgt != PAD
    torch.testing.assert_close(more_logits[:, : tgt.size(1)][real], logits[real],
                               atol=ATOL, rtol=0)


@pytest.mark.parametrize("pre_norm", [False, True], ids=["post-norm", "pre-norm"])
def test_a_padded_batch_equals_each_sentence_alone(pre_norm):
    model = tiny_model(pre_norm)
    with torch.no_grad():
        batch_logits = model(pad_batch(SRC), pad_batch(TGT))
        for i, (src, tgt) in enumerate(zip(SRC, TGT)):
            alone = model(torch.tensor([src]), torch.tensor([tgt]))[0]
            torch.testing.assert_close(batch_logits[i, : len(tgt)], alone, atol=ATOL, rtol=0)


def test_an_all_padding_source_gives_finite_outputs():
    model = tiny_model()
    src = pad_batch([SRC[0], [PAD] * 3])
    with torch.no_grad():
        logits = model(src, pad_batch(TGT[:2]))
    assert torch.isfinite(logits).all()


def test_no_nan_under_bf16_autocast_on_a_padded_batch():
    model = tiny_model(pre_norm=True)
    src = pad_batch([*SRC, [PAD] * 2])  # includes an all-padding source
    tgt = pad_batch([*TGT, [BOS]])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(src, tgt)
    assert torch.isfinite(logits).all()


def test_one_cast_per_attention_input_under_bf16_autocast(monkeypatch):
    """attention.autocast_input casts a LayerNorm's fp32 output (and the encoder memory)
    to bf16 once for the q, k and v projections, where autocast would cast it for each:
    the same logits bit for bit, and the same gradients up to bf16 rounding (the three
    projections' input gradients are summed in bf16 before the one cast back)."""
    import transformer.model.attention as attention
    import transformer.model.transformer as model_module

    def step():
        model = tiny_model(pre_norm=True).train()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(pad_batch(SRC), pad_batch(TGT))
        logits.float().square().mean().backward()
        return logits.detach(), [p.grad for p in model.parameters()]

    once_logits, once_grads = step()
    monkeypatch.setattr(attention, "autocast_input", lambda x: x)
    monkeypatch.setattr(model_module, "autocast_input", lambda x: x)
    each_logits, each_grads = step()
    assert once_logits.dtype == torch.bfloat16
    assert torch.equal(once_logits, each_logits)
    for a, b in zip(once_grads, each_grads):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-3)


# --- causality ---------------------------------------------------------------------------


def test_changing_target_token_t_changes_no_logit_before_t():
    model = tiny_model()
    src, tgt = pad_batch(SRC[:1]), torch.tensor([[BOS, 5, 6, 7, 8, 9]])
    with torch.no_grad():
        base = model(src, tgt)
        for t in range(1, tgt.size(1)):
            changed = tgt.clone()
            changed[0, t] = 4 if tgt[0, t] != 4 else 10
            logits = model(src, changed)
            torch.testing.assert_close(logits[:, :t], base[:, :t], atol=ATOL, rtol=0)
            assert (logits[:, t:] - base[:, t:]).abs().amax() > 1e-3, f"t={t}"


# --- cross-attention reads every real source token and no pad ----------------------------


def test_first_decoder_position_depends_on_every_real_source_token_and_no_pad():
    model = tiny_model()
    src = pad_batch(SRC)  # row 1 has 4 real tokens and 3 pads
    captured = {}

    def keep_output(_module, _inputs, output):
        captured["src_emb"] = output

    handle = model.src_embed.register_forward_hook(keep_output)
    try:
        logits = model(src, pad_batch(TGT))
    finally:
        handle.remove()
    (grad,) = torch.autograd.grad(logits[1, 0].sum(), captured["src_emb"])  # (B, S, D)
    per_token = grad.abs().sum(-1)  # (B, S)
    real = src[1] != PAD
    assert torch.all(per_token[1, real] > 0)
    assert torch.all(per_token[1, ~real] == 0)
    assert torch.all(per_token[[0, 2]] == 0)  # and no other sentence of the batch


# --- incremental decoding ----------------------------------------------------------------


def decode_step_by_step(model, tgt, memory, src, cache=None, start=0):
    cache = cache if cache is not None else DecoderCache()
    steps = [model.decode(tgt[:, t : t + 1], memory, src, cache)
             for t in range(start, tgt.size(1))]
    return torch.cat(steps, dim=1), cache


@pytest.mark.parametrize("use_sdpa", [False, True], ids=["explicit", "sdpa"])
@pytest.mark.parametrize("pre_norm", [False, True], ids=["post-norm", "pre-norm"])
def test_cached_incremental_decoding_equals_full_decoding(pre_norm, use_sdpa):
    model = tiny_model(pre_norm)
    set_attention_path(model, use_sdpa)
    src, tgt = pad_batch(SRC), pad_batch(TGT)
    with torch.no_grad():
        memory = model.encode(src)
        full = model.decode(tgt, memory, src)
        incremental, cache = decode_step_by_step(model, tgt, memory, src)
    assert len(cache) == tgt.size(1)
    real = tgt != PAD
    torch.testing.assert_close(incremental[real], full[real], atol=ATOL, rtol=0)


def test_cache_reorder_keeps_the_chosen_rows_consistent():
    model = tiny_model()
    src, tgt = pad_batch(SRC), pad_batch(TGT)
    index = torch.tensor([2, 0, 0, 1])  # as beam search would pick rows
    with torch.no_grad():
        memory = model.encode(src)
        first, cache = decode_step_by_step(model, tgt[:, :2], memory, src)
        cache.reorder(index, index)  # each row its own sentence: the sentences follow
        rest, _ = decode_step_by_step(model, tgt[index], memory[index], src[index], cache,
                                      start=2)
        full = model.decode(tgt[index], memory[index], src[index])
    incremental = torch.cat([first[index], rest], dim=1)
    real = tgt[index] != PAD
    torch.testing.assert_close(incremental[real], full[real], atol=ATOL, rtol=0)


def test_reorder_without_cross_caches_is_exact_among_rows_of_one_source():
    """Beam search keeps the cross-attention caches when beams only move within their
    sentence: rows sharing a source have identical cross-attention keys and values."""
    model = tiny_model()
    src = pad_batch([SRC[0]] * 3)  # three beams of one sentence
    tgt = pad_batch([[BOS, 5, 6, 7, 8], [BOS, 9, 10, 11, 12], [BOS, 13, 14, 15, 16]])
    index = torch.tensor([1, 1, 0])
    with torch.no_grad():
        memory = model.encode(src)
        first, cache = decode_step_by_step(model, tgt[:, :2], memory, src)
        cache.reorder(index)  # the sentences stay
        rest, _ = decode_step_by_step(model, tgt[index], memory, src, cache, start=2)
        full = model.decode(tgt[index], memory, src)
    torch.testing.assert_close(torch.cat([first[index], rest], dim=1), full, atol=ATOL, rtol=0)


# --- input checks ------------------------------------------------------------------------


def test_clear_errors_for_bad_inputs():
    model = tiny_model()
    src, tgt = pad_batch(SRC), pad_batch(TGT)
    memory = model.encode(src)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.encode(torch.tensor([[4, V]]))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.decode(torch.tensor([[BOS, -1], [BOS, 4], [BOS, 5]]), memory, src)
    with pytest.raises(ValueError, match="batch, length"):
        model.encode(torch.tensor([4, 5, 6]))
    with pytest.raises(ValueError, match="batch, length"):
        model.encode(torch.tensor([[4.0, 5.0]]))
    with pytest.raises(ValueError, match="shapes disagree"):
        model.decode(tgt, memory[:, :-1], src)
    with pytest.raises(ValueError, match="shapes disagree"):
        model.decode(tgt[:2], memory, src)
    too_long = torch.full((1, model.cfg.max_positions + 1), 4)
    with pytest.raises(ValueError, match="max_positions"):
        model.encode(too_long)
    with pytest.raises(ValueError, match="max_positions"):
        model(src[:1], too_long)


def test_cached_decoding_past_max_positions_raises():
    model = tiny_model(max_positions=4)
    src = torch.tensor([[5, 6, EOS]])
    with torch.no_grad():
        memory = model.encode(src)
        cache = DecoderCache()
        model.decode(torch.tensor([[BOS, 5, 6, 7]]), memory, src, cache)
        with pytest.raises(ValueError, match="max_positions"):
            model.decode(torch.tensor([[8]]), memory, src, cache)


# --- tying and initialisation ------------------------------------------------------------


def test_tied_embeddings_share_one_parameter():
    model = tiny_model(tie_embeddings=True)
    w = model.src_embed.weight
    assert model.tgt_embed.weight is w and model.out_proj.weight is w
    assert sum(p is w for p in model.parameters()) == 1  # counted once


def test_untied_embeddings_are_three_parameters():
    model = tiny_model(tie_embeddings=False)
    ws = [model.src_embed.weight, model.tgt_embed.weight, model.out_proj.weight]
    assert len({id(w) for w in ws}) == 3
    assert not torch.equal(ws[0], ws[1])


def test_xavier_init_and_zero_biases_and_pad_embedding():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=100, d_model=128, n_heads=4, d_ff=512, n_encoder_layers=1,
                      n_decoder_layers=1, dropout=0.0, attn_dropout=0.0, max_positions=8)
    model = Transformer(cfg)
    for w in (model.encoder_layers[0].ffn.linear1.weight,  # (512, 128)
              model.decoder_layers[0].cross_attn.q_proj.weight,  # (128, 128)
              model.src_embed.weight):  # (100, 128)
        fan_out, fan_in = w.shape
        expected = (2 / (fan_in + fan_out)) ** 0.5
        assert abs(w.std().item() / expected - 1) < 0.05, tuple(w.shape)
    for name, p in model.named_parameters():
        if name.endswith("bias") and "norm" not in name:
            assert torch.all(p == 0), name
    assert torch.all(model.src_embed.weight[PAD] == 0)


# --- learning ----------------------------------------------------------------------------


def copy_batch(g: torch.Generator, n: int):
    """Random sequences of length 5-8 over ids 4..V-1; target = source."""
    seqs = [random_ids(g, int(torch.randint(5, 9, (1,), generator=g))) for _ in range(n)]
    src = pad_batch([[*s, EOS] for s in seqs])
    tgt_in = pad_batch([[BOS, *s] for s in seqs])
    tgt_out = pad_batch([[*s, EOS] for s in seqs])
    return src, tgt_in, tgt_out


def test_a_tiny_model_learns_to_copy():
    torch.manual_seed(0)
    # Matrices this small gain nothing from threads, and on a busy CI machine extra
    # threads oversubscribe the cores (measured: 20x slower per step).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        accuracy, seconds = train_copy_task(steps=200)
    finally:
        torch.set_num_threads(threads)
    assert accuracy >= 0.95, f"teacher-forced accuracy {accuracy:.3f} after {seconds:.1f}s"


def train_copy_task(steps: int) -> tuple[float, float]:
    """Train a 2+2-layer model on fresh copy batches; token accuracy on a fresh batch."""
    cfg = ModelConfig(vocab_size=V, d_model=64, n_heads=4, d_ff=128, n_encoder_layers=2,
                      n_decoder_layers=2, dropout=0.0, attn_dropout=0.0, max_positions=16)
    model = Transformer(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3, betas=(0.9, 0.98))
    g = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    for _ in range(steps):
        src, tgt_in, tgt_out = copy_batch(g, 64)
        logits = model(src, tgt_in)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    src, tgt_in, tgt_out = copy_batch(torch.Generator().manual_seed(123), 256)
    with torch.no_grad():
        pred = model(src, tgt_in).argmax(-1)
    real = tgt_out != PAD  # real target positions only, the </s> included
    accuracy = (pred[real] == tgt_out[real]).float().mean().item()
    return accuracy, time.perf_counter() - start
