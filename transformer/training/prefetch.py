"""Batches collated ahead of the step that needs them: `Prefetcher`, a background thread.

A thread collates the next batches into a bounded queue, pinned when the device is a GPU
so that the loop's `Batch.to(device, non_blocking=True)` is an asynchronous copy. Each
batch is gathered and padded from flat numpy arrays of the corpus' ids
(`batching.TokenIds`, read once from the dataset's Arrow buffers): a few numpy array
operations a batch, not Python lists built row by row, so the thread holds the GIL the
training loop needs to launch kernels only briefly (docs/results/training-speed.md, "Batch assembly").

Exact resume does not depend on the thread: each item carries its own position (epoch,
index), and the loop saves the position after the item it consumed, never how far the
thread read ahead. The thread ends with the loop: `close` (in `fit`'s `finally`, so also
on an exception, a stop signal or Ctrl-C) stops it and drops what it had read ahead; an
exception in the thread is raised in the loop at the item it would have produced.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

from transformer.data.batching import TokenBatchSampler, TokenIds

# Seconds between the thread's looks at the stop flag while the queue is full.
_POLL = 0.05


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class Prefetcher:
    """Runs `items` (an iterator of (epoch, index, Batch)) in a background thread, at most
    `depth` items ahead; iterate it in place of `items`.

    Args:
        items: what to read ahead; consumed only by the thread.
        depth: items held ready (the queue's bound: `depth` batches of host memory).
        pin: page-lock each batch (`Batch.pin_memory`), for asynchronous copies to a GPU.
    """

    def __init__(self, items: Iterator[tuple[int, int, Any]], depth: int, pin: bool = False) -> None:
        self.queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self.stopping = threading.Event()
        self.pin = pin
        self.thread = threading.Thread(target=self._run, args=(items,), name="batch-prefetch", daemon=True)
        self.thread.start()

    def _run(self, items: Iterator[tuple[int, int, Any]]) -> None:
        try:
            for epoch, index, batch in items:
                if self.pin:
                    batch = batch.pin_memory()
                if not self._put((epoch, index, batch)):
                    return
            self._put(_Failed(StopIteration()))
        except BaseException as e:
            self._put(_Failed(e))

    def _put(self, item: object) -> bool:
        while not self.stopping.is_set():
            try:
                self.queue.put(item, timeout=_POLL)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> tuple[int, int, Any]:
        item = self.queue.get()
        if isinstance(item, _Failed):
            raise item.error
        return item

    def close(self) -> None:
        """Stop the thread and drop what it read ahead (idempotent)."""
        self.stopping.set()
        while self.thread.is_alive():
            try:
                self.queue.get_nowait()
            except queue.Empty:
                self.thread.join(timeout=_POLL)
        self.thread.join()


def batch_stream(sampler: TokenBatchSampler, train_ids: TokenIds, tokenizer, epoch: int, start: int,
                 pad_to_multiple: int, vocab_size: int) -> Iterator[tuple[int, int, Any]]:
    """Endless (epoch, index, Batch) stream of `sampler`'s shard from batch `start` of
    `epoch`, collated from `train_ids`. Changes no state: the prefetch thread runs it."""
    while True:
        batches = sampler.batches(epoch)
        for index in range(start, len(batches)):
            yield epoch, index, train_ids.collate_rows(batches.rows_of(index), tokenizer.pad_id, tokenizer.bos_id,
                                                       tokenizer.eos_id, pad_to_multiple, vocab_size)
        epoch, start = epoch + 1, 0
