"""The attention picture (transformer/inspection/attention_plots.py) of a greedy translation:
the cross-attention rows of the pieces, each summing to one, drawn as a PNG.

Moved verbatim from tests/commands/test_translate.py (#52)."""

from __future__ import annotations

import torch

from transformer.inspection.attention_plots import cross_attention, plot_alignment


def test_attention_picture_of_a_greedy_translation(loaded, tmp_path):
    model, tokenizer = loaded
    sentence = "Ci vediamo martedì alle due."
    alignment = cross_attention(model, tokenizer, sentence, layer=-1, max_len_a=0, max_len_b=5)
    assert alignment.src_pieces == tokenizer.pieces(sentence)
    assert alignment.tgt_pieces[-1] == tokenizer.id_to_piece(tokenizer.eos_id)
    assert alignment.weights.shape == (len(alignment.tgt_pieces), len(alignment.src_pieces))
    torch.testing.assert_close(alignment.weights.sum(dim=1), torch.ones(len(alignment.tgt_pieces)))
    assert alignment.layer == len(model.decoder_layers) - 1
    assert not model.decoder_layers[-1].cross_attn.store_weights  # switched off again
    png = plot_alignment(alignment, tmp_path / "attention.png")
    assert png.read_bytes().startswith(b"\x89PNG")
