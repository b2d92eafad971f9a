"""A line every few seconds while preparation's long steps run (transformer/data/heartbeat.py):
training the vocabulary and encoding the corpus say what they do and how far they are."""

from __future__ import annotations

import logging
import re
import threading
from typing import ClassVar

import pytest

from transformer.config import DataConfig
from transformer.data import encode_split, heartbeat, tokenizer
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


class Recorded:
    """A Heartbeat that records its status as its step starts and ends, whatever the time."""

    said: ClassVar[list[str]] = []

    def __init__(self, status, every=None, logger=None) -> None:
        self.status = status

    def __enter__(self):
        Recorded.said.append(self.status())
        return self

    def __exit__(self, *exc) -> None:
        Recorded.said.append(self.status())


def test_preparation_says_what_it_does_while_it_trains_the_vocabulary_and_encodes(tmp_path, monkeypatch):
    monkeypatch.setattr(Recorded, "said", [])
    monkeypatch.setattr(tokenizer, "Heartbeat", Recorded)
    monkeypatch.setattr(encode_split, "Heartbeat", Recorded)
    prepare_data(DataConfig(name="sample", spm_vocab_size=300, cache_dir=str(tmp_path)))
    assert Recorded.said == [
        "tokenizer: drawing a sample of at most 1,000,000 sentences: 0 read",
        "tokenizer: SentencePiece chooses 300 unigram pieces from 800 sentences",
        "encoding train: 0 of 400 pairs", "encoding train: 400 of 400 pairs",
        "encoding dev: 0 of 50 pairs", "encoding dev: 50 of 50 pairs"]


def test_the_tokenizers_status_follows_its_phases():
    progress = tokenizer._Progress(8000, "bpe", at_most=5)
    assert list(progress.count(["a", "b", "c"], "read")) == ["a", "b", "c"]
    assert progress.status() == "tokenizer: drawing a sample of at most 5 sentences: 3 read"
    progress.sampled = 3
    next(iter(progress.count(["a", "b", "c"], "fed")))
    assert progress.status() == "tokenizer: SentencePiece reads the sample: 1 of 3 sentences"
    progress.fed = 3
    assert progress.status() == "tokenizer: SentencePiece chooses 8,000 bpe pieces from 3 sentences"


@pytest.mark.parametrize("every", [None, 2.5])
def test_the_interval_is_the_modules_unless_given(monkeypatch, every):
    monkeypatch.setattr(heartbeat, "HEARTBEAT_SECONDS", 7.0)
    assert Heartbeat(lambda: "", every=every).every == (every or 7.0)
