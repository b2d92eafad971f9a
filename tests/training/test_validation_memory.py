"""Validation on CPU gives back the heap it freed before training goes on: training's
heap trimmer lets up to `trainer.heap_slack_gb` of free heap pile up, and validation's
batches (longer than training's, and greedy decoding's key/value caches growing one
position a step) would otherwise leave their holes under every later peak (#51)."""

from __future__ import annotations

import pytest

from transformer import device

from helpers import run


@pytest.mark.skipif(device._glibc() is None, reason="malloc_trim is glibc's")
def test_validation_on_cpu_ends_with_the_free_heap_given_back(tmp_path):
    trainer = run(tmp_path / "run", "trainer.max_steps=1", "trainer.heap_slack_gb=null")
    blocks = [bytearray(64 * 1024) for _ in range(3200)]  # 200 MB of heap blocks
    del blocks[::2]  # 100 MB of holes between live blocks, as a validation's batches leave them
    held = device.anonymous_memory()
    trainer.validate()
    assert device.anonymous_memory() < held - 50 * 2**20
