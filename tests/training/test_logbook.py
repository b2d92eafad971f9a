"""The training log: a window averages over the tokens of its updates (not over updates) and
times itself; a skipped update's finite loss counts but does not move the bar; the log line
and TensorBoard tags are the ones readers look up by name (`learning_curves.py`,
`scripts/gpu/gpu_check.py`, the tests); ranks other than 0 write no events."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from transformer.metrics.name_copy import NameCopy
from transformer.training import logbook as logbook_module
from transformer.training.logbook import Logbook, LogWindow
from transformer.training.state import TrainState
from transformer.training.validation import DevResult

CPU = torch.device("cpu")
TRAIN_TAGS = {"train/loss", "train/nll", "train/lr", "train/grad_norm", "train/tokens_per_s",
              "train/skipped_steps", "train/epoch", "train/hours", "train/cpu_mem_gb"}


def metrics(loss_sum: float, tokens: int, applied: bool = True, nll_sum: float | None = None) -> dict[str, float]:
    """An update's metrics as Trainer.train_step returns them."""
    nll_sum = loss_sum / 2 if nll_sum is None else nll_sum
    return {"loss": loss_sum / tokens, "nll": nll_sum / tokens, "loss_sum": loss_sum, "nll_sum": nll_sum,
            "grad_norm": 1.5, "tokens": tokens, "applied": float(applied)}


def events(tb_dir) -> EventAccumulator:
    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    return acc


@pytest.fixture
def clock(monkeypatch):
    """The windows' clock, moved by hand: clock[0] seconds."""
    now = [0.0]
    monkeypatch.setattr(logbook_module.time, "perf_counter", lambda: now[0])
    return now


def test_a_window_is_token_weighted_over_its_updates(clock):
    window = LogWindow()
    window.add(metrics(loss_sum=10.0, tokens=10))  # mean 1.0 over 10 tokens
    window.add(metrics(loss_sum=90.0, tokens=30, nll_sum=60.0))  # mean 3.0 over 30 tokens
    clock[0] = 4.0
    summary = window.summary()
    assert summary["loss"] == pytest.approx(100 / 40)  # not (1.0 + 3.0) / 2
    assert summary["nll"] == pytest.approx(65 / 40)
    assert summary["tokens_per_s"] == pytest.approx(40 / 4.0)


def test_reset_empties_the_window_and_restarts_its_clock(clock):
    window = LogWindow()
    window.add(metrics(loss_sum=10.0, tokens=10))
    clock[0] = 5.0
    window.reset()
    assert window.summary() == {"loss": 0.0, "nll": 0.0, "tokens_per_s": 0.0}  # empty: no division by zero
    window.add(metrics(loss_sum=6.0, tokens=3))
    clock[0] = 6.0
    assert window.summary() == pytest.approx({"loss": 2.0, "nll": 1.0, "tokens_per_s": 3.0})


def test_skipped_updates_count_in_the_window_only_when_finite_and_never_move_the_bar(tmp_path, clock):
    book = Logbook(None, CPU)
    book.open(step=7, end=(100, "max_steps=100"), show_bar=True)  # on stderr, which pytest captures
    book.add(metrics(loss_sum=10.0, tokens=10))
    book.add(metrics(loss_sum=30.0, tokens=10, applied=False))  # skipped, its loss finite: counted
    book.add(metrics(loss_sum=math.inf, tokens=10, applied=False))  # inf: left out
    assert book.window.tokens == 20 and book.window.loss == 40.0
    assert book.bar.n == 8  # from the resumed step, one applied update
    book.close()


def test_the_train_report_logs_a_line_and_the_tags_readers_look_up_then_starts_a_new_window(
        tmp_path, clock, caplog):
    book = Logbook(tmp_path / "tb", CPU)
    book.open(step=0, end=(100, "max_steps=100"), show_bar=False)
    book.add(metrics(loss_sum=12.0, tokens=4))
    clock[0] = 2.0
    state = TrainState(step=5, epoch=1, skipped_steps=2, train_seconds=1800.0)
    with caplog.at_level(logging.INFO):
        book.train(state, metrics(loss_sum=12.0, tokens=4), lr=3e-4)
    assert ("step 5: loss 3.000, 2 target tokens/s, lr 3.00e-04, epoch 1; max_steps=100 ends the run "
            "at about update 100") in caplog.text
    assert book.window.tokens == 0
    book.close()
    acc = events(tmp_path / "tb")
    assert set(acc.Tags()["scalars"]) == TRAIN_TAGS
    value = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in TRAIN_TAGS}
    assert value["train/loss"] == [(5, 3.0)] and value["train/tokens_per_s"] == [(5, 2.0)]
    assert value["train/hours"] == [(5, 0.5)] and value["train/skipped_steps"] == [(5, 2.0)]
    assert value["train/grad_norm"] == [(5, 1.5)] and value["train/epoch"] == [(5, 1.0)]


def dev(bleu: float, names: NameCopy | None = None) -> DevResult:
    return DevResult(loss=2.0, nll=1.5, ppl=4.48, bleu=bleu, chrf=bleu + 10,
                     names=names or NameCopy(names=4, copied=3, sentences=4),
                     examples=[("ciao", "hello", "hi")])


def test_one_dev_set_is_reported_under_dev(tmp_path, caplog):
    book = Logbook(tmp_path / "tb", CPU)
    with caplog.at_level(logging.INFO):
        book.validation(10, {"sample": dev(20.0)}, score=20.0, best=25.0)
    book.close()
    assert "step 10 dev: loss 2.000 ppl 4.48 BLEU 20.00 chrF 30.00 names 75.0% (3/4)" in caplog.text
    assert "step 10 dev BLEU 20.00 (best 25.00)" in caplog.text
    acc = events(tmp_path / "tb")
    assert set(acc.Tags()["scalars"]) == {f"dev/{k}" for k in ("loss", "nll", "ppl", "bleu", "chrf", "name_copy")}
    assert [(e.step, e.value) for e in acc.Scalars("dev/name_copy")] == [(10, 75.0)]  # percent
    assert acc.Tags()["tensors"] == ["dev/translations/text_summary"]


def test_several_dev_sets_each_get_their_tags_and_dev_bleu_is_the_selection_score(tmp_path, caplog):
    book = Logbook(tmp_path / "tb", CPU)
    results = {"europarl": dev(10.0), "tatoeba": dev(30.0, NameCopy(names=0, copied=0, sentences=0))}
    with caplog.at_level(logging.INFO):
        book.validation(4, results, score=20.0, best=20.0)
    book.close()
    assert "step 4 dev europarl: loss" in caplog.text and "step 4 dev tatoeba: loss" in caplog.text
    assert "step 4 mean dev BLEU 20.00 (best 20.00)" in caplog.text
    acc = events(tmp_path / "tb")
    scalars = set(acc.Tags()["scalars"])
    assert {"dev/europarl/bleu", "dev/tatoeba/bleu", "dev/europarl/name_copy", "dev/bleu"} <= scalars
    assert "dev/tatoeba/name_copy" not in scalars  # no names in that dev set: no rate
    assert [(e.step, e.value) for e in acc.Scalars("dev/bleu")] == [(4, 20.0)]


def test_ranks_other_than_zero_write_no_events_but_still_report(tmp_path, caplog):
    book = Logbook(None, CPU)
    book.open(step=0, end=(10, "max_steps=10"), show_bar=False)
    with caplog.at_level(logging.INFO):
        book.train(TrainState(step=1), metrics(loss_sum=1.0, tokens=1), lr=1e-3)
        book.validation(1, {"sample": dev(1.0)}, score=1.0, best=1.0)
    book.close()
    assert "step 1: loss" in caplog.text and "step 1 dev BLEU" in caplog.text
    assert list(tmp_path.iterdir()) == []
