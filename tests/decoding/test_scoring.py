"""decoding/scoring.py: forced scoring gives the search's own scores, whatever the batch
a pair is scored in; a line scores the sum of its sentences; what cannot be scored is
named."""

from __future__ import annotations

import pytest
import torch

from transformer.config import DecodeConfig
from transformer.data.batching import pad
from transformer.decoding.scoring import score_lines, unit_scores
from transformer.decoding.search import search
from transformer.decoding.settings import decode_settings
from transformer.decoding.text import _inference_mode

from helpers import FAST, LINES

CPU = torch.device("cpu")


@pytest.mark.parametrize("keywords", [FAST, dict(FAST, method="beam", beam_size=3, nbest=3, lenpen=0.6),
                                      dict(FAST, method="beam", beam_size=2, nbest=2, min_len=3)],
                         ids=["greedy", "beam", "beam-min-len"])
def test_a_hypothesis_scores_what_the_search_scored_it(loaded, keywords):
    """Teacher forcing the search's own tokens gives its score (the length limit forced
    some of the EOS here, min_len forbade some: neither changes a log-probability)."""
    model, tokenizer = loaded
    cfg = decode_settings(DecodeConfig(**keywords), CPU, model)
    src = tokenizer.encode([line for line in LINES if line.strip()])
    with _inference_mode(model, "fp32", CPU):
        nbest = search(model, pad(src, tokenizer.pad_id), cfg)
        pairs = [(ids, h) for ids, hyps in zip(src, nbest, strict=True) for h in hyps]
        got = unit_scores(model, [ids for ids, _ in pairs], [h.tokens for _, h in pairs], cfg, CPU)
    assert got == pytest.approx([h.score for _, h in pairs], abs=1e-4)


def test_a_pair_scores_the_same_alone_and_in_any_batch(loaded):
    model, _ = loaded
    g = torch.Generator().manual_seed(0)
    pairs = [(torch.randint(4, 300, (n,), generator=g).tolist(), torch.randint(4, 300, (m,), generator=g).tolist())
             for n, m in ((3, 7), (9, 2), (1, 1), (12, 10), (5, 0))]
    src, tgt = [s for s, _ in pairs], [t for _, t in pairs]
    with _inference_mode(model, "fp32", CPU):
        alone = [unit_scores(model, [s], [t], DecodeConfig(lenpen=0.6), CPU)[0] for s, t in pairs]
        for budget in (12, 40, 2000):  # from one pair a batch to all in one
            together = unit_scores(model, src, tgt, DecodeConfig(lenpen=0.6, batch_tokens=budget), CPU)
            assert together == pytest.approx(alone, abs=1e-4)
    assert all(score < 0 for score in alone)  # log-probabilities, EOS included: an empty target too


def test_a_line_scores_the_sum_of_its_sentences_and_an_empty_line_zero(loaded):
    model, tokenizer = loaded
    cfg = decode_settings(DecodeConfig(**FAST, split_sentences=True), CPU, model)
    parts = score_lines(model, tokenizer, ["Ciao.", "Come stai?"], ["Hi.", "How are you?"], cfg, CPU)
    line = score_lines(model, tokenizer, ["Ciao. Come stai?", ""], ["Hi. How are you?", ""], cfg, CPU)
    assert line[0] == pytest.approx(sum(parts), abs=1e-4) and line[1] == 0.0


def test_a_target_longer_than_the_model_writes_is_named(loaded):
    model, tokenizer = loaded
    cfg = decode_settings(DecodeConfig(**FAST), CPU, model)
    too_long = " ".join(["parola"] * model.cfg.max_positions)
    with pytest.raises(ValueError, match=r"^target 2: a translation of \d+ tokens"):
        score_lines(model, tokenizer, ["Ciao", "Ciao"], ["Hi", too_long], cfg, CPU)
    with pytest.raises(ValueError, match=r"^pair 1: 1 source and \d+ target tokens"):
        unit_scores(model, [[5]], [[5] * model.cfg.max_positions], cfg, CPU)


def test_a_segmented_translation_is_scored_unit_by_unit(loaded):
    """Pieces with their segments (`Translation.segments`) are cut there and each part
    scored against its sentence, whatever sentences their text would split into; without
    them the pieces are one part and the line is scored whole, or refused in one line
    where its source is longer than the model reads."""
    model, tokenizer = loaded
    cfg = decode_settings(DecodeConfig(**FAST, split_sentences=True), CPU, model)
    pieces = [tokenizer.id_to_piece(i) for i in tokenizer.encode(["Hi how are you"])[0]]
    cut = score_lines(model, tokenizer, ["Ciao. Come stai?"], [pieces], cfg, CPU,
                      segments=[[1, len(pieces) - 1]])
    parts = score_lines(model, tokenizer, ["Ciao.", "Come stai?"], [pieces[:1], pieces[1:]], cfg, CPU)
    whole = score_lines(model, tokenizer, ["Ciao. Come stai?"], [pieces], cfg, CPU)
    assert cut[0] == pytest.approx(sum(parts), abs=1e-4) and abs(whole[0] - cut[0]) > 1e-3
    long_line = ", ".join(["Come stai oggi amico mio"] * 8) + "."
    assert len(tokenizer.encode([long_line])[0]) > model.cfg.max_positions
    with pytest.raises(ValueError, match=rf"^line 1: .* reads at most {model.cfg.max_positions} tokens "
                                         r"\(model.max_positions\)"):
        score_lines(model, tokenizer, [long_line], [pieces], cfg, CPU)
