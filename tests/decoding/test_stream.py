"""decoding/stream.py: how `windows` cuts a stream of lines (its budget of source tokens
and lines, and its readiness rule for interactive input), `input_ready`, and `iter_nbest`
against translating the same lines at once."""

from __future__ import annotations

import itertools
import os

import pytest
import torch

from transformer.config import DecodeConfig
from transformer.data.corpus import normalize
from transformer.data.sentences import segment, split_sentences
from transformer.decoding.stream import input_ready, iter_nbest, windows
from transformer.decoding.text import translate_nbest

from helpers import FAST, LINES, sample_tokenizer

MAX_LEN = 64  # the units' longest, as a model's max_positions
TEXT = ["Che ore sono?", "Ti chiamo stasera.", "Sì, certo!", "Ci vediamo martedì alle due.",
        "Il treno parte alle otto e mezza.", "Grazie.", "Dove abiti?", "Non lo so."]


def tokens(line: str) -> int:
    return len(sample_tokenizer().encode([normalize(line)])[0])


def cut(lines, budget: int, ready=None) -> list[list[str]]:
    """The lines of each window `windows` makes of `lines`."""
    return [w.lines for w in windows(lines, sample_tokenizer(), budget, ready, max_len=MAX_LEN)]


def test_the_windows_hold_every_line_once_in_input_order():
    for budget in (1, 5, 12, 1000):
        found = cut(TEXT, budget)
        assert [line for window in found for line in window] == TEXT
        assert all(found)  # no empty window
    assert cut([], 10) == []


@pytest.mark.parametrize("budget", [5, 12, 30])
def test_a_window_closes_at_the_line_that_reaches_the_token_budget(budget):
    found = cut(TEXT, budget)
    for window in found[:-1]:
        counts = [tokens(line) for line in window]
        assert sum(counts) >= budget or len(window) >= budget  # full: by tokens or by lines
        assert sum(counts[:-1]) < budget and len(window) - 1 < budget  # not full a line earlier
    assert sum(tokens(line) for line in found[-1]) > 0  # what is left comes last, not dropped


def test_a_window_holds_at_most_budget_lines_however_short():
    empty = [""] * 7  # no tokens at all: only the line count closes a window
    assert [len(w) for w in cut(empty, 3)] == [3, 3, 1]


def test_a_window_closes_early_when_no_line_is_waiting():
    waiting = iter([True, False, True, True, False, True, True, True])
    found = cut(TEXT, 10_000, ready=lambda: next(waiting))
    assert [len(w) for w in found] == [2, 3, 3]  # closed after each "nothing waiting"
    always = cut(TEXT, 10_000, ready=lambda: True)
    assert always == [TEXT]  # a file or a fast pipe: full windows


def test_windows_read_no_further_than_the_window_they_close():
    pulled = []

    def endless():
        for line in itertools.cycle(TEXT):
            pulled.append(line)
            yield line

    first = next(windows(endless(), sample_tokenizer(), 12, max_len=MAX_LEN))
    assert pulled == first.lines  # nothing read ahead of the window handed out


def test_a_line_that_is_not_a_str_is_named_by_its_index():
    with pytest.raises(TypeError, match=r"^lines\[2\] is a bytes, not a str$"):
        cut(["Ciao", "Sì", b"no"], 100)


def test_input_ready_is_none_without_a_descriptor_and_follows_a_pipe():
    assert input_ready(["Ciao"]) is None and input_ready(iter(TEXT)) is None
    read, write = os.pipe()
    with os.fdopen(read, "rb", buffering=0) as reader, os.fdopen(write, "wb", buffering=0) as writer:
        ready = input_ready(reader)
        assert ready is not None and ready() is False  # nothing written yet
        writer.write(b"Ciao\n")
        assert ready() is True
        reader.readline()
        assert ready() is False


def test_iter_nbest_gives_what_translating_the_lines_at_once_gives(loaded):
    model, tokenizer = loaded
    cfg = DecodeConfig(**FAST)
    at_once = translate_nbest(model, tokenizer, LINES, cfg, torch.device("cpu"))
    counts: dict[str, int] = {}
    lazily = list(iter_nbest(model, tokenizer, iter(LINES), DecodeConfig(**FAST, batch_tokens=4), counts=counts))
    assert [[text for text, _ in nbest] for nbest in lazily] == [[text for text, _ in nbest] for nbest in at_once]
    assert [score for nbest in lazily for _, score in nbest] == pytest.approx(
        [score for nbest in at_once for _, score in nbest], abs=1e-5)  # other batches: float sums differ
    assert counts["lines"] == len(LINES)


def test_iter_nbest_refuses_a_bad_setting_before_reading_a_line(loaded):
    from transformer.config import ConfigError

    model, tokenizer = loaded
    pulled = []

    def lines():
        pulled.append(1)
        yield "Ciao"

    with pytest.raises(ConfigError):
        iter_nbest(model, tokenizer, lines(), DecodeConfig(method="beam", beam_size=0))
    assert pulled == []


def test_a_window_hands_on_its_lines_split_and_encoded_as_a_whole_file_is():
    for window in windows([*TEXT, "", "Ciao. Come stai?"], sample_tokenizer(), 12, max_len=MAX_LEN):
        whole = segment(window.lines, sample_tokenizer(), MAX_LEN)
        assert (window.segments.ids, window.segments.owner) == (whole.ids, whole.owner)
        assert window.segments.n_lines == len(window.lines)


class CountingTokenizer:
    """A tokenizer that records every text it is asked to encode."""

    def __init__(self, tokenizer):
        self.inner, self.encoded = tokenizer, []

    def encode(self, texts):
        self.encoded.extend(texts)
        return self.inner.encode(texts)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_streamed_line_is_encoded_once(loaded):
    """iter_nbest (mt-translate) and Translator.translate_iterable encode each sentence of
    each line once, however many windows the input makes."""
    from transformer import Translator

    model, tokenizer = loaded
    lines = [*LINES, "Ciao. Come stai? Bene.", *LINES]
    sentences = sorted(s for line in lines for s in split_sentences(line))
    assert len(list(windows(lines, tokenizer, 6, max_len=model.cfg.max_positions))) > 3
    counting = CountingTokenizer(tokenizer)
    found = list(iter_nbest(model, counting, iter(lines), DecodeConfig(**FAST, batch_tokens=6)))
    assert len(found) == len(lines) and sorted(counting.encoded) == sentences
    counting = CountingTokenizer(tokenizer)
    translator = Translator(model, counting, decode=DecodeConfig(**FAST))
    found = list(translator.translate_iterable(iter(lines), batch_tokens=6, return_scores=True))
    assert len(found) == len(lines) and sorted(counting.encoded) == sentences
