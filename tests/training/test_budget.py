"""What ends a run, and when (transformer/training/budget.py): the nearest limit's estimate
is the progress bar's total, named; the limits stop the loop, said in the log."""

from __future__ import annotations

import re

import numpy as np
import pytest

from transformer.config import TrainerConfig
from transformer.data.batching import TokenBatchSampler
from transformer.training.budget import Budget
from transformer.training.logbook import Logbook
from transformer.training.state import TrainState

from helpers import run


def sampler(pairs: int = 400) -> TokenBatchSampler:
    lengths = np.random.default_rng(0).integers(3, 30, pairs)
    return TokenBatchSampler(lengths, lengths, max_tokens=200)


def budget(**limits) -> Budget:
    return Budget(TrainerConfig(**limits), sampler())


def test_max_steps_alone_is_the_end():
    b = budget(max_steps=500)
    assert b.end(TrainState(step=10)) == (500, "max_steps=500")
    assert b.describe() == "max_steps=500"


def test_max_epochs_ends_after_the_batches_left_over_accum_steps():
    b = budget(max_steps=100_000, max_epochs=3, accum_steps=2)
    per_epoch = len(b.sampler.batches(0))
    assert len(b.sampler.batches(1)) == pytest.approx(per_epoch, rel=0.05)  # the estimate's premise
    state = TrainState(step=7, epoch=0, batch_index=14)
    assert b.end(state) == (7 + (3 * per_epoch - 14) // 2, "max_epochs=3")
    last = TrainState(step=50, epoch=2, batch_index=per_epoch - 3)
    assert b.end(last) == (51, "max_epochs=3")
    assert b.end(TrainState(step=60, epoch=3)) == (60, "max_epochs=3")  # reached: no update left
    assert b.stop(TrainState(step=60), epoch=3) == "max_epochs=3" and b.stop(TrainState(), epoch=2) is None
    assert budget(max_steps=10, max_epochs=3).end(state) == (10, "max_steps=10")  # the nearer one


def test_max_hours_ends_at_the_training_time_left_over_the_time_an_update_takes():
    b = budget(max_steps=100_000, max_hours=1.0)
    resumed = TrainState(step=1000, train_seconds=1800.0)
    b.start(resumed)
    assert b.end(resumed) == (100_000, "max_steps=100000")  # no update timed yet
    now = TrainState(step=1100, train_seconds=2000.0)  # 2 s an update since the resume
    assert b.end(now) == (1100 + 800, "max_hours=1")
    assert b.stop(TrainState(train_seconds=3600.0), epoch=0) == "max_hours=1"
    assert b.describe() == "max_steps=100000, max_hours=1 (training time)"


def test_the_bar_counts_to_the_estimate_and_names_the_limit():
    book = Logbook(None, torch_cpu())
    book.open(step=5, end=(100, "max_steps=100"), show_bar=True)
    assert (book.bar.total, book.bar.desc) == (100, "train to max_steps=100")
    metrics = {"loss_sum": 1.0, "nll_sum": 1.0, "tokens": 1, "applied": 1, "grad_norm": 1.0}
    book.train(TrainState(step=6), metrics, lr=1e-3, end=(40, "max_hours=2"))
    assert (book.bar.total, book.bar.desc) == (40, "train to max_hours=2")
    book.close()


def torch_cpu():
    import torch

    return torch.device("cpu")


def test_a_run_to_max_epochs_says_where_it_ends_and_ends_there(tmp_path):
    """Without a bar the log lines say which limit ends the run and at about which update;
    an epoch's batches are known, so the estimate is the update it stops at."""
    trainer = run(tmp_path / "run", "trainer.max_epochs=1", "trainer.log_every=2")
    logged = (tmp_path / "run" / "train.log").read_text()
    assert "training until the first of max_steps=20, max_epochs=1" in logged
    ends = {int(n) for n in re.findall(r"max_epochs=1 ends the run at about update (\d+)", logged)}
    assert ends == {trainer.state.step} and trainer.state.step < 20
    assert f"max_epochs=1 reached at step {trainer.state.step}" in logged
