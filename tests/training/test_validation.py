"""Validation (transformer/training/validation.py): the BLEU sample spans the whole dev set.

Moved from tests/commands/test_train.py (#52)."""

from __future__ import annotations

import pytest

from transformer import checkpoint as ckpt
from transformer.training.validation import Validator, bleu_sample

from helpers import run


def test_validation_bleu_sample_spans_the_whole_dev_set():
    """Dev files may be sorted by length: validation samples them evenly, not their head."""
    picked = bleu_sample(2000, 500)
    assert len(picked) == 500 == len(set(picked))
    assert picked[0] == 0 and picked[-1] >= 1996 and picked == sorted(picked)
    assert bleu_sample(30, None) == list(range(30)) == bleu_sample(30, 100)
    with pytest.raises(ValueError, match="val_bleu_sentences"):
        bleu_sample(30, 0)


def test_a_failure_in_validation_keeps_the_updates_before_it(tmp_path, monkeypatch):
    """A bad dev shard ended the run in validation and no checkpoint held its updates."""
    def broken(self, model):
        raise RuntimeError("src_ids holds ids outside the vocabulary")

    monkeypatch.setattr(Validator, "__call__", broken)
    with pytest.raises(RuntimeError, match="outside the vocabulary"):
        run(tmp_path / "run", "trainer.max_steps=20", "trainer.val_every=10")
    saved = ckpt.step_checkpoints(tmp_path / "run")
    assert [p.name for p in saved] == ["step_10"]
    assert ckpt.load_trainer_state(saved[0])["train_state"]["step"] == 10


@pytest.mark.parametrize(("asked", "training", "decoded"),
                         [("auto", "bf16", "bf16"), ("auto", "fp32", "fp32"), ("fp32", "bf16", "fp32")])
def test_dev_bleu_decodes_in_the_precision_the_model_trains_in(asked, training, decoded):
    """decode.precision auto follows the training precision (a CPU's decoding auto is fp32,
    for exports' sake; dev BLEU needs no export's agreement and bf16 is faster there); an
    explicit decode.precision is kept."""
    import torch

    from transformer.config import DecodeConfig

    validator = Validator({}, None, DecodeConfig(precision=asked), 0.1, training, torch.device("cpu"),
                          4096, 10, 64)
    assert validator.decode.precision == decoded
