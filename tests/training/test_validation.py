"""Validation (transformer/training/validation.py): the BLEU sample spans the whole dev set.

Moved from tests/commands/test_train.py (#52)."""

from __future__ import annotations

import pytest

from transformer.training.validation import bleu_sample


def test_validation_bleu_sample_spans_the_whole_dev_set():
    """Dev files may be sorted by length: validation samples them evenly, not their head."""
    picked = bleu_sample(2000, 500)
    assert len(picked) == 500 == len(set(picked))
    assert picked[0] == 0 and picked[-1] >= 1996 and picked == sorted(picked)
    assert bleu_sample(30, None) == list(range(30)) == bleu_sample(30, 100)
    with pytest.raises(ValueError, match="val_bleu_sentences"):
        bleu_sample(30, 0)
