"""Text in, text out (transformer/decoding/text.py) on a tiny random checkpoint: input order
and empty lines kept, the model's training mode restored, a too-long sentence translated in
pieces with a warning, decode defaults that follow the device.

Moved verbatim from tests/commands/test_translate.py (#52)."""

from __future__ import annotations

import logging

from transformer.config import DecodeConfig
from transformer.decoding import text as decoding

from helpers import FAST, LINES


def test_translate_lines_keeps_order_and_empty_lines(loaded):
    model, tokenizer = loaded
    cfg = DecodeConfig(**FAST, batch_tokens=12)  # several batches, sorted by length
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
