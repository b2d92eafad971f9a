"""Text in, text out (transformer/decoding/text.py) on a tiny random checkpoint: input order
and empty lines kept, the model's training mode restored, a too-long sentence translated in
pieces with a warning, decode defaults that follow the device.

Moved verbatim from tests/commands/test_translate.py (#52)."""

from __future__ import annotations

import logging

import pytest
import torch

from transformer import device as device_module
from transformer.config import DecodeConfig
from transformer.decoding import text as decoding

from helpers import FAST, LINES


def test_translate_lines_keeps_order_and_empty_lines(loaded):
    model, tokenizer = loaded
    cfg = DecodeConfig(**FAST, max_tokens=12)  # several batches, sorted by length
    out = decoding.translate_lines(model, tokenizer, LINES, cfg)
    assert len(out) == len(LINES)
    assert out[1] == "" and out[3] == ""
    alone = [decoding.translate_lines(model, tokenizer, [line], cfg)[0] for line in LINES]
    assert out == alone
    assert all(out[i] for i in (0, 2, 4, 5))


def test_translate_lines_restores_training_mode(loaded):
    model, tokenizer = loaded
    model.train()
    decoding.translate_lines(model, tokenizer, LINES[:1], DecodeConfig(**FAST))
    assert model.training
    model.eval()


def test_too_long_input_is_translated_in_pieces_with_a_warning(loaded, caplog):
    model, tokenizer = loaded
    long_line = " ".join(["Ci vediamo martedì alle due"] * 20)  # one sentence > max_len = 32 tokens
    with caplog.at_level(logging.WARNING):
        out = decoding.translate_lines(model, tokenizer, [long_line], DecodeConfig(**FAST))
    assert len(out) == 1 and out[0]
    assert "1 input line(s) hold a sentence longer than the model's limit of 32 tokens" in caplog.text


def test_decode_defaults_depend_on_the_device(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda:0")  # no CUDA needed: capabilities mocked
    monkeypatch.setattr(device_module, "cpu_bf16_support", lambda: (False, "AVX2 only"))
    monkeypatch.setattr(device_module, "cuda_bf16_support", lambda device: (True, "a GPU"))
    settings = decoding.decode_settings
    assert settings(DecodeConfig(), cpu) == DecodeConfig(max_tokens=2000, precision="fp32")
    assert settings(DecodeConfig(), cuda) == DecodeConfig(max_tokens=8000, precision="bf16")
    monkeypatch.setattr(device_module, "cpu_bf16_support", lambda: (True, "AVX512-BF16"))
    assert settings(DecodeConfig(), cpu) == DecodeConfig(max_tokens=2000, precision="bf16")
    monkeypatch.setattr(device_module, "cuda_bf16_support", lambda device: (False, "an old GPU"))
    assert settings(DecodeConfig(), cuda).precision == "fp16"
    given = DecodeConfig(max_tokens=123, precision="fp32")
    assert settings(given, cuda) == given
    with pytest.raises(ValueError, match=r"decode.max_tokens=0: must be >= 1 \(or null\)"):
        settings(DecodeConfig(max_tokens=0), cpu)
    with pytest.raises(ValueError, match=r"decode.precision=fp16 needs CUDA"):
        settings(DecodeConfig(precision="fp16"), cpu)
