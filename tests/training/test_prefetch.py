"""transformer/training/prefetch.py: the thread reads ahead at most `depth` items, hands
them over in order, raises its error in the loop's thread, and stops when closed."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from transformer.training.prefetch import Prefetcher


def counting(seen: list[int]):
    for i in itertools.count():
        seen.append(i)
        yield 0, i, f"batch {i}"


def test_items_come_in_order_and_the_thread_reads_at_most_depth_ahead():
    seen: list[int] = []
    stream = Prefetcher(counting(seen), depth=3)
    assert [next(stream)[1] for _ in range(5)] == [0, 1, 2, 3, 4]
    time.sleep(0.3)
    assert len(seen) <= 5 + 3 + 1  # the queue's bound, and one item in the thread's hand
    stream.close()
    assert not stream.thread.is_alive()


def test_an_error_in_the_thread_is_raised_in_the_loop_at_its_item():
    def failing():
        yield 0, 0, "first"
        raise ValueError("bad row 7")

    stream = Prefetcher(failing(), depth=2)
    assert next(stream)[2] == "first"
    with pytest.raises(ValueError, match="bad row 7"):
        next(stream)
    stream.close()


def test_close_stops_a_thread_blocked_on_a_full_queue():
    before = threading.active_count()
    stream = Prefetcher(counting([]), depth=1)
    time.sleep(0.1)  # the queue is full, the thread waits to put
    stream.close()
    stream.close()  # idempotent
    assert not stream.thread.is_alive() and threading.active_count() == before
