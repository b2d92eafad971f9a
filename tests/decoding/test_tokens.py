"""Token-level output: tokens, token scores, attention and alignment, and exact rescoring.

Properties, on a random tiny checkpoint that ends about a third of its sentences early
(and on its CTranslate2 export): each translation's score is the sum of its token scores
over the search's length penalty; `score` of the Translation gives that score back on
every line (of its tokens alone, on every line of one sentence); the attention rows are
the last decoder layer's weights (the module's own, `store_weights`, averaged over heads)
and sum to 1 within the rounding of the precision they are computed in; the forced
pass's logits are the model's forward's.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from transformer import Translator
from transformer.checkpoint import load_model, save_checkpoint
from transformer.config import ConfigError
from transformer.decoding.finished import length_penalty
from transformer.decoding.tokens import _decode_with_attention, alignment

from helpers import end_sentences, pad_batch, tiny_checkpoint, tiny_model

ONE_SENTENCE = ["Che ore sono?", "Ti chiamo stasera.", "Sì, certo!", "Ciao", "Dove sei?",
                "Ci vediamo martedì alle due.", "Il sig. Rossi è arrivato.", "Vado a casa."]
LINES = [*ONE_SENTENCE, "", "Che ore sono? Vado a casa."]  # an empty line, two sentences
SHORT = dict(max_len_a=0, max_len_b=10)
SEARCHES = [dict(method="greedy"), dict(beam_size=3, nbest=2), dict(beam_size=4, lenpen=1.0),
            dict(method="greedy", min_len=3)]


@pytest.fixture(scope="module")
def ending(tmp_path_factory) -> Path:
    model, tokenizer = load_model(tiny_checkpoint(tmp_path_factory.mktemp("e") / "ckpt",
                                                  max_positions=32, seed=5))
    with torch.no_grad():
        end_sentences(model, rate=0.3)
    return save_checkpoint(tmp_path_factory.mktemp("e") / "ending", model, tokenizer, "", {})


def entries(found) -> list:
    return [t for entry in found for t in (entry if isinstance(entry, list) else [entry])]


def sources_of(lines, found) -> list[str]:
    return [line for line, entry in zip(lines, found, strict=True)
            for _ in (entry if isinstance(entry, list) else [entry])]


def check_tokens(translator: Translator, keywords: dict, lenpen: float,
                 tol: dict | None = None) -> None:
    """`tol`: pytest.approx's tolerance of two computations of one score (fp32: 1e-4)."""
    tol = tol or dict(abs=1e-4)
    found = translator.translate(LINES, return_scores=True, **SHORT, **keywords)
    hyps = entries(found)
    lengths = set()
    for line, t in zip(sources_of(LINES, found), hyps, strict=True):
        sentences = 2 if line == LINES[-1] else 0 if not line else 1
        assert len(t.token_scores) == len(t.tokens) + sentences
        assert len(t.segments) == sentences and sum(t.segments) == len(t.tokens)
        if sentences == 1:  # score = sum / lp, EOS last
            lengths.add(len(t.tokens))
            assert t.score == pytest.approx(sum(t.token_scores) / length_penalty(len(t.tokens) + 1, lenpen),
                                            **tol)
            assert translator.tokenizer.decode([translator.tokenizer.piece_ids(t.tokens)])[0] == t.text
    assert len(lengths) > 1 or keywords.get("lenpen")  # some ended early, some at the limit
    # exact rescoring: the tokens give the search's score back on every one-sentence line
    single = [(s, t) for s, t in zip(sources_of(LINES, found), hyps, strict=True) if s in ONE_SENTENCE]
    rescored = translator.score([s for s, _ in single], [t.tokens for _, t in single], **keywords)
    assert rescored == pytest.approx([t.score for _, t in single], **tol)
    with_tokens = translator.score([s for s, _ in single], [t.tokens for _, t in single],
                                   return_tokens=True, **keywords)
    for (score, token_scores), (_, t) in zip(with_tokens, single, strict=True):
        assert token_scores == pytest.approx(t.token_scores, **tol)
        assert score == pytest.approx(t.score, **tol)
    # the Translations themselves: every line, two sentences and an empty one included
    assert translator.score(sources_of(LINES, found), hyps, **keywords) == \
        pytest.approx([t.score for t in hyps], **tol)
    unsplit = dict(keywords, split_sentences=False)  # a line of two sentences, decoded whole
    found = translator.translate(LINES, return_scores=True, **SHORT, **unsplit)
    hyps = entries(found)
    assert translator.score(sources_of(LINES, found), [t.tokens for t in hyps], **unsplit) == \
        pytest.approx([t.score for t in hyps], **tol)


@pytest.mark.parametrize("keywords", SEARCHES, ids=lambda k: "-".join(f"{a}{b}" for a, b in k.items()))
def test_a_score_is_its_token_scores_over_the_length_penalty(ending, keywords):
    check_tokens(Translator.load(ending), keywords, keywords.get("lenpen", 0.6))


@pytest.mark.parametrize("keywords", SEARCHES[:2], ids=["greedy", "nbest"])
def test_in_bf16_a_score_is_its_token_scores_within_bf16s_rounding(ending, keywords):
    """What `auto` gives on a GPU and a bf16 CPU (named here): the search's step and the
    forced pass may round apart in bf16, so the scores agree to bf16's 8 significant
    bits, 2**-8 of the score (as docs/python-api.md's `close` allows), not to fp32's 1e-4."""
    translator = Translator.load(ending, precision="bf16", dtype="bf16")
    assert {p.dtype for p in translator.model.parameters()} == {torch.bfloat16}
    check_tokens(translator, keywords, keywords.get("lenpen", 0.6), tol=dict(abs=2**-8, rel=2**-8))


@pytest.mark.parametrize("keywords", SEARCHES[:3], ids=["greedy", "nbest", "lenpen"])
def test_an_exports_tokens_score_as_its_search(ending, keywords, tmp_path):
    pytest.importorskip("ctranslate2")
    from transformer.commands.export import export
    from transformer.deploy.ct2_export import ExportConfig

    out = export(ExportConfig(checkpoint=str(ending), output=str(tmp_path / "ct2")))
    translator = Translator.load(out, device="cpu", threads=1)
    check_tokens(translator, keywords, keywords.get("lenpen", 0.6))
    with pytest.raises(ConfigError, match=r"^return_attention=True: an exported model gives no attention"):
        translator.translate("Ciao", return_attention=True)
    with pytest.raises(ConfigError, match=r"^return_attention=True: an exported model gives no attention"):
        translator.translate_iterable(["Ciao"], return_attention=True)  # at the call, not at next()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_attention_rows_are_distributions_over_the_source_and_align(ending, precision):
    """Each row sums to 1 within its precision's rounding: each weight rounded to the
    dtype moves the sum by at most eps / 2 of it, the softmax kernel and the mean over
    heads by a few eps of fp32; 4 eps bounds both (bf16's 2**-7 = 7.8e-3, fp32's 1.2e-7)."""
    translator = Translator.load(ending, method="greedy", precision=precision, dtype=precision, **SHORT)
    bound = 4 * torch.finfo({"fp32": torch.float32, "bf16": torch.bfloat16}[precision]).eps
    found = translator.translate(LINES, return_attention=True)
    for line, t in zip(LINES, found, strict=True):
        assert len(t.attention) == len(t.token_scores)
        assert all(len(row) == len(t.source_tokens) for row in t.attention)
        assert all(abs(sum(row) - 1.0) <= bound for row in t.attention)
        assert len(t.alignment) == len(t.tokens)
        if line in ONE_SENTENCE:  # the rows of the pieces, then the EOS's
            assert all(row[j] == max(row) for j, row in zip(t.alignment, t.attention[:-1], strict=True))
    two = found[-1]  # each sentence's rows attend to its own source pieces only
    first = len(translator.tokenizer.encode(["Che ore sono?"])[0])
    assert all(abs(sum(row[:first]) - 1.0) <= bound for row in two.attention[:2])
    assert found[-2].attention == [] and found[-2].source_tokens == []
    assert alignment([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3], [0.0, 0.0, 1.0]], 2) == [1, 0]


@pytest.mark.parametrize("pre_norm", [False, True])
def test_the_attention_is_the_last_layers_own_weights_averaged_over_heads(pre_norm):
    model = tiny_model(pre_norm=pre_norm, seed=2, n_decoder_layers=3)
    src = pad_batch([[5, 6, 7, 8, 9], [10, 11]])
    tgt_in = pad_batch([[2, 12, 13, 14], [2, 15]])
    last = model.decoder_layers[-1].cross_attn
    with torch.no_grad():
        logits, weights = _decode_with_attention(model, src, tgt_in, attention=True)
        last.store_weights = True  # the reference: the module's own softmax, kept
        try:
            expected = model(src, tgt_in)
            reference = last.weights.mean(dim=1)
        finally:
            last.store_weights, last.weights = False, None
    torch.testing.assert_close(logits, expected)
    torch.testing.assert_close(weights, reference)
    assert weights[1, :, 2:].abs().max() == 0  # padding gets nothing
    assert not math.isnan(weights.sum())
