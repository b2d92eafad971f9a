"""A decoding batch's memory (transformer/decoding/batch_memory.py): the estimate grows with
its rows and lengths, and decoding that would need more memory than is free is refused
before the first batch, in one line naming the keys. Moved from tests/test_bounds.py with
the functions (#52)."""

from __future__ import annotations

import pytest
import torch

from transformer import bounds
from transformer.checkpoint import load_model
from transformer.config import ConfigError, DecodeConfig, ModelConfig
from transformer.decoding import batch_memory
from transformer.decoding import text as decoding

from helpers import tiny_checkpoint


def test_the_memory_estimate_grows_with_the_rows_and_the_lengths():
    model = ModelConfig(vocab_size=8000, d_model=512, n_decoder_layers=6)
    one = batch_memory.decode_batch_bytes(model, 1, 10, 1, 22, 4)
    assert batch_memory.decode_batch_bytes(model, 1, 10, 5, 22, 4) == 5 * one  # beam: rows
    assert batch_memory.decode_batch_bytes(model, 3, 10, 1, 22, 4) == 3 * one  # sentences: rows
    assert batch_memory.decode_batch_bytes(model, 1, 20, 1, 34, 4) > one  # longer: more cache
    assert batch_memory.decode_batch_bytes(model, 1, 10, 1, 22, 2) < one  # bf16 caches are half


def test_decoding_that_would_not_fit_in_free_memory_is_refused_before_the_first_batch(tmp_path, monkeypatch):
    model, tokenizer = load_model(tiny_checkpoint(tmp_path / "ckpt"))
    lines = ["Ciao"] * 100
    searched = []
    monkeypatch.setattr(decoding, "search", lambda *a, **k: searched.append(1))
    monkeypatch.setattr(bounds, "available_memory", lambda device: 1_000_000)  # 1 MB free
    cfg = DecodeConfig(beam_size=128, max_tokens=100_000, precision="fp32")
    with pytest.raises(ConfigError, match=r"decode.beam_size=128 with decode.max_tokens=100000: a decoding "
                                          r"batch of 100 sentences x beam 128 would need about .* lower "
                                          r"decode.beam_size or decode.max_tokens"):
        decoding.translate_lines(model, tokenizer, lines, cfg, torch.device("cpu"))
    assert not searched
    monkeypatch.undo()  # the machine's own free memory: these settings fit
    assert len(decoding.translate_lines(model, tokenizer, lines[:2], DecodeConfig(method="greedy"))) == 2
