"""Shared test settings: one torch thread (tiny models; no oversubscription on 2 cores)."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
