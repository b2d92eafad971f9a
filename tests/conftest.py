"""Shared test settings: one torch thread, and the same precision on every CPU.

`precision: auto` picks bf16 on CPUs with native bf16 (AMX, AVX512-BF16) and fp32 on the
others. The suite runs as on the latter everywhere, so that its results do not depend on
the machine: `MT_CPU_BF16=0` in the environment, which the processes that tests start
inherit (a mock would reach this process only). tests/test_device.py covers both kinds by
mocking the capability, and checks a subprocess against the real detection.
"""

import os

import pytest
import torch

from transformer import device


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# In the environment, not a mock: every process a test starts (torchrun workers, the
# commands, sweeps) inherits it and resolves `precision: auto` as this process does.
os.environ[device.CPU_BF16_ENV] = "0"


@pytest.fixture(autouse=True, scope="session")
def _shared_data_cache(tmp_path_factory):
    """The prepared-data cache the debug training runs share (tests/helpers.shared_cache);
    an environment variable, so subprocesses (the console, sweep and DDP tests) share it too."""
    os.environ["MT_TEST_DATA_CACHE"] = str(tmp_path_factory.mktemp("data-cache"))
    yield
    del os.environ["MT_TEST_DATA_CACHE"]


# A random tiny model with a SentencePiece vocabulary trained on data/sample, one per test
# module (a module that needs another defines its own `checkpoint`, which takes precedence).
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random tiny model's checkpoint directory (max_positions 32)."""
    from helpers import tiny_checkpoint

    return tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "best", max_positions=32)


@pytest.fixture(scope="module")
def loaded(checkpoint):
    """`checkpoint`'s (model, tokenizer)."""
    from transformer.checkpoint import load_model

    return load_model(checkpoint)
