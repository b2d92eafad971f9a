"""transformer/training/distributed.py: a process outside `torchrun` is a group of one,
and the RNG states a checkpoint carries give back the same draws after a resume."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
import torch

from transformer.training.distributed import (
    DistInfo,
    launched_by_torchrun,
    rng_state,
    seed_everything,
    set_rng_state,
    setup_distributed,
)

TORCHRUN_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def _draws() -> tuple:
    return (random.random(), random.gauss(0, 1), float(np.random.rand()),
            float(np.random.standard_normal()), torch.rand(3).tolist())


@pytest.fixture
def no_torchrun(monkeypatch):
    for var in TORCHRUN_VARS:
        monkeypatch.delenv(var, raising=False)


def test_outside_torchrun_a_process_is_rank_0_of_one_on_the_cpu(no_torchrun):
    assert not launched_by_torchrun()
    info, device = setup_distributed("cpu")
    assert info == DistInfo(rank=0, world_size=1, local_rank=0) and info.is_main
    assert device == torch.device("cpu")
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize(("env", "launched"), [
    ({"WORLD_SIZE": "2"}, True),
    ({"WORLD_SIZE": "1"}, False),
    ({"RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, True),  # --nproc_per_node=1
    ({"RANK": "0", "MASTER_ADDR": "127.0.0.1"}, False),
])
def test_a_torchrun_worker_is_told_by_its_environment(no_torchrun, monkeypatch, env, launched):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert launched_by_torchrun() is launched


def test_only_rank_0_is_the_main_process():
    assert DistInfo(0, 4, 0).is_main
    assert not DistInfo(3, 4, 1).is_main


def test_the_same_seed_gives_the_same_draws():
    seed_everything(1234)
    first = _draws()
    seed_everything(1234)
    assert _draws() == first
    seed_everything(1235)
    assert _draws() != first


def test_restored_rng_states_draw_what_an_uninterrupted_run_would():
    """Through torch.save and torch.load(weights_only=True), as a checkpoint carries them,
    a gaussian's cached second value included."""
    seed_everything(7)
    random.gauss(0, 1)  # leaves a cached value in Python's state
    np.random.standard_normal()
    buffer = io.BytesIO()
    torch.save(rng_state(), buffer)
    expected = _draws()
    seed_everything(99)  # anything in between
    _draws()
    buffer.seek(0)
    set_rng_state(torch.load(buffer, weights_only=True))
    assert _draws() == expected
