"""A decoding batch's memory (transformer/decoding/batch_memory.py): the estimate grows with
its rows and lengths, and decoding that would need more memory than is free is refused
before the first batch, in one line naming the keys; the estimate of a batch's cache is what a search's cache
holds."""

from __future__ import annotations

import pytest
import torch

from transformer import bounds
from transformer.checkpoint import load_model
from transformer.config import ConfigError, DecodeConfig, ModelConfig
from transformer.decoding import batch_memory, settings
from transformer.decoding import text as decoding

from helpers import tiny_checkpoint


def test_the_memory_estimate_grows_with_the_rows_and_the_lengths():
    model = ModelConfig(vocab_size=8000, d_model=512, n_decoder_layers=6)
    one = batch_memory.decode_batch_bytes(model, 1, 10, 1, 22, 4)
    beam = batch_memory.decode_batch_bytes(model, 1, 10, 5, 22, 4)
    assert one < beam < 5 * one  # rows, but the memory's keys and values once a sentence
    assert batch_memory.decode_batch_bytes(model, 3, 10, 1, 22, 4) == pytest.approx(3 * one, rel=1e-3)
    assert batch_memory.decode_batch_bytes(model, 1, 20, 1, 34, 4) > one  # longer: more cache
    assert batch_memory.decode_batch_bytes(model, 1, 10, 1, 22, 2) < one  # bf16 caches are half


@pytest.mark.parametrize("method", ["beam", "greedy"])
@pytest.mark.parametrize("lengths", [[3, 4], [30, 2, 17], [60] * 5], ids=["short", "mixed", "long"])
def test_the_cache_estimate_is_what_a_searchs_cache_holds(method, lengths, monkeypatch):
    """Within 10%: the bytes of the `DecoderCache` a search allocates (both buffers of each
    kind, measured) against `decode_cache_bytes` for that batch."""
    from transformer.decoding import decoder_state
    from transformer.decoding.search import search
    from transformer.model.transformer import build_model

    cfg = ModelConfig(vocab_size=64, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=1,
                      n_decoder_layers=2, max_positions=128)
    model = build_model(cfg).eval()
    caches = []
    real = decoder_state.DecoderCache
    monkeypatch.setattr(decoder_state, "DecoderCache",
                        lambda *a, **k: caches.append(real(*a, **k)) or caches[-1])
    g = torch.Generator().manual_seed(0)
    width = max(lengths)
    src = torch.tensor([[*torch.randint(4, 64, (n,), generator=g).tolist()] + [0] * (width - n)
                        for n in lengths])
    decode = DecodeConfig(method=method, beam_size=4, max_len_a=1.2, max_len_b=10)
    held = []
    monkeypatch.setattr(real, "reorder", lambda self, *a, _r=real.reorder: held.append(self.nbytes())
                        or _r(self, *a))
    with torch.inference_mode():
        search(model, src, decode)
    measured = max([*held, caches[0].nbytes()])
    max_len = min(cfg.max_positions - 1, int(decode.max_len_a * width + decode.max_len_b))
    beam = decode.beam_size if method == "beam" else 1
    estimate = batch_memory.decode_cache_bytes(cfg, len(lengths), width, beam, max_len, 4)
    assert estimate == pytest.approx(measured, rel=0.10)


def test_decoding_that_would_not_fit_in_free_memory_is_refused_before_the_first_batch(tmp_path, monkeypatch):
    model, tokenizer = load_model(tiny_checkpoint(tmp_path / "ckpt"))
    lines = ["Ciao"] * 100
    searched = []
    monkeypatch.setattr(decoding, "search", lambda *a, **k: searched.append(1))
    monkeypatch.setattr(bounds, "available_memory", lambda device: 1_000_000)  # 1 MB free
    cfg = DecodeConfig(beam_size=128, batch_tokens=100_000, precision="fp32")
    with pytest.raises(ConfigError, match=r"decode.beam_size=128 with decode.batch_tokens=100000: a decoding "
                                          r"batch of 100 sentences x beam 128 would need about .* lower "
                                          r"decode.beam_size or decode.batch_tokens"):
        decoding.translate_lines(model, tokenizer, lines, cfg, torch.device("cpu"))
    assert not searched
    monkeypatch.undo()  # the machine's own free memory: these settings fit
    assert len(decoding.translate_lines(model, tokenizer, lines[:2], DecodeConfig(method="greedy"))) == 2


@pytest.mark.parametrize("method", ["beam", "greedy"])
def test_a_gpu_decoding_batch_grows_to_what_half_the_free_memory_holds(monkeypatch, method):
    model = ModelConfig(vocab_size=8000, d_model=512, n_decoder_layers=6, max_positions=256)
    cfg = DecodeConfig(method=method, beam_size=5, precision="bf16")
    frees = (None, 10**8, 40 * 10**9, 100 * 10**9, 10**12)
    budgets = [batch_memory.decode_batch_tokens(model, cfg, free, 8000, 65536) for free in frees]
    assert budgets[:2] == [8000, 8000]  # unknown, or too little for more: today's 8,000
    assert budgets == sorted(budgets) and budgets[-1] == 64000  # more memory, more tokens, bounded
    for free, budget in zip(frees[2:], budgets[2:], strict=True):
        # batch_memory.check_decode_memory, given half the memory, accepts the worst batches of
        # a budget above the floor (many short sentences, few long ones), not of twice it
        monkeypatch.setattr(bounds, "available_memory", lambda device, free=free: free // 2)
        for length in (1, 2, 10, 100, 255):
            batch_memory.check_decode_memory(model, [[length] * (budget // length)], cfg, torch.device("cuda"))
        if budget < 64000:
            with pytest.raises(ConfigError):
                batch_memory.check_decode_memory(model, [[1] * (budget * 2)], cfg, torch.device("cuda"))


def test_decode_settings_size_the_batch_to_the_gpu_only_when_batch_tokens_is_null(monkeypatch):
    class Model:  # what decode_settings reads of our model: its config
        cfg = ModelConfig(vocab_size=8000, d_model=512, n_decoder_layers=6, max_positions=256)

    monkeypatch.setattr(settings, "available_memory", lambda device: 200 * 10**9)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    cfg = DecodeConfig(precision="fp16")
    assert settings.decode_settings(cfg, cuda, Model()).batch_tokens == 32000  # half of 200 GB
    assert settings.decode_settings(cfg, cuda).batch_tokens == 8000  # no model to size it for
    assert settings.decode_settings(DecodeConfig(batch_tokens=3000, precision="fp16"), cuda,
                                    Model()).batch_tokens == 3000
    assert settings.decode_settings(DecodeConfig(precision="fp32"), cpu, Model()).batch_tokens == 2000
