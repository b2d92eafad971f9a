"""The vectorised language identifier gives py3langid's own answers."""

from __future__ import annotations

import numpy as np
import pytest

from transformer.data.corpus import read_lines
from transformer.paths import PROJECT_ROOT

pytest.importorskip("py3langid", reason="py3langid not installed (pip install 'transformer-mt[filters]')")

from py3langid.langid import MODEL_FILE, LanguageIdentifier

from transformer.data.langid import MAX_BYTES, NO_FEATURES, language_id

SAMPLE = PROJECT_ROOT / "data" / "sample"
ODD = ["", "!!!", "1999/0067", "a", "CIAO A TUTTI", "Это тест.", "日本語のテキスト", "Ελληνικά κείμενα",
       "Das ist ein deutscher Satz.", "C'est une phrase française.", "x" * 50, "\U0001f600 ok"]


def test_it_classifies_as_py3langid_does_a_text_at_a_time():
    """Every sentence of the sample corpus, both sides, and odd texts (empty, all capitals,
    other scripts, no letters), in one batch: the same language and probability."""
    texts = [*read_lines(SAMPLE / "dev.it"), *read_lines(SAMPLE / "dev.en"), *ODD]
    reference = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    model = language_id()
    index, prob = model.classify(texts)
    for text, i, p in zip(texts, index, prob, strict=True):
        lang, expected = reference.classify(text)
        if i != NO_FEATURES:  # with no feature py3langid's answer is an arbitrary first label
            assert model.languages[i] == lang, text
        assert p == pytest.approx(expected, abs=1e-4), text


def test_a_text_alone_and_in_a_batch_get_the_same_answer():
    texts = [*read_lines(SAMPLE / "dev.it")[:20], *ODD]
    probs, featureless = language_id().probabilities(texts)
    for k in (0, 7, len(texts) - 1):
        alone, none = language_id().probabilities([texts[k]])
        assert np.allclose(alone[0].numpy(), probs[k].numpy(), atol=1e-6) and none[0] == featureless[k]
    assert featureless.tolist() == [False] * 20 + [t in ("", "!!!", "1999/0067", "a") for t in ODD]


def test_only_the_first_bytes_of_a_long_text_are_read():
    head = "Il Parlamento europeo approva la relazione. " * (MAX_BYTES // 40)
    long_probs, _ = language_id().probabilities([head[:MAX_BYTES] + "Parliament agrees." * 1000])
    head_probs, _ = language_id().probabilities([head[:MAX_BYTES]])
    assert np.allclose(long_probs.numpy(), head_probs.numpy())


def test_texts_walked_in_groups_of_bounded_bytes_get_the_same_answers(monkeypatch):
    from transformer.data import langid

    texts = [*read_lines(SAMPLE / "dev.it")[:30], *ODD]
    whole, none = language_id().probabilities(texts)
    monkeypatch.setattr(langid, "BATCH_BYTES", 50)  # a group every text or two
    grouped, none_grouped = language_id().probabilities(texts)
    assert np.allclose(grouped.numpy(), whole.numpy(), atol=1e-6) and (none_grouped == none).all()
    assert language_id().probabilities([])[0].shape == (0, len(language_id().languages))
