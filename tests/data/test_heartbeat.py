"""A line every few seconds while preparation's long steps run (transformer/data/heartbeat.py):
training the vocabulary and encoding the corpus say what they do and how far they are."""

from __future__ import annotations

import logging
import re
import threading

import pytest

from transformer.config import DataConfig
from transformer.data import heartbeat
from transformer.data.heartbeat import Heartbeat
from transformer.data.pipeline import prepare_data


def test_a_heartbeat_logs_its_status_until_the_step_ends(caplog):
    calls = []
    step_done = threading.Event()

    def status() -> str:
        calls.append(1)
        if len(calls) == 3:
            step_done.set()
        return f"working: {len(calls)} of 3"

    with caplog.at_level(logging.INFO), Heartbeat(status, every=0.01):
        assert step_done.wait(5)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) >= 3
    assert all(re.fullmatch(r"working: \d of 3 \(\d s so far\)", m) for m in lines[:3]), lines
    caplog.clear()
    with caplog.at_level(logging.INFO), Heartbeat(status, every=10.0):  # done sooner: nothing said
        pass
    assert caplog.records == []


def test_preparation_says_what_it_does_while_it_trains_the_vocabulary_and_encodes(
        tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(heartbeat, "HEARTBEAT_SECONDS", 0.001)
    with caplog.at_level(logging.INFO):
        prepare_data(DataConfig(name="sample", spm_vocab_size=300, cache_dir=str(tmp_path)))
    said = [r.getMessage() for r in caplog.records]
    tokenizer = [m for m in said if m.startswith("tokenizer: ")]
    assert tokenizer, said
    phases = (r"drawing a sample of at most 1,000,000 sentences: [\d,]+ read",
              r"SentencePiece reads the sample: [\d,]+ of [\d,]+ sentences",
              r"SentencePiece chooses 300 unigram pieces from [\d,]+ sentences")
    assert all(any(re.fullmatch(f"tokenizer: {p} \\(\\d+ s so far\\)", m) for p in phases) for m in tokenizer)
    assert any(re.fullmatch(r"encoding train: [\d,]+ of 400 pairs \(\d+ s so far\)", m) for m in said), said
    assert any(re.fullmatch(r"encoding dev: [\d,]+ of 50 pairs \(\d+ s so far\)", m) for m in said), said


@pytest.mark.parametrize("every", [None, 2.5])
def test_the_interval_is_the_modules_unless_given(monkeypatch, every):
    monkeypatch.setattr(heartbeat, "HEARTBEAT_SECONDS", 7.0)
    assert Heartbeat(lambda: "", every=every).every == (every or 7.0)
