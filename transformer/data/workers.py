"""Worker processes for preparation: `map` over a stream of chunks, in order.

Preparation (`pipeline.prepare_data`) cleans and encodes a corpus chunk by chunk; with
`data.num_proc` > 1 the chunks go to that many worker processes while the main process
reads the corpus and writes the results, in order. The workers are spawned (the main
process may hold torch's OpenMP threads, which do not survive a fork), once per
preparation and only for a stream of `MIN_CHUNKS` chunks or more: a small corpus never
pays their start (about a second each). They ignore Ctrl-C: the main process gets it,
stops them, and prints its one line.
"""

from __future__ import annotations

import collections
import itertools
import multiprocessing
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor

MIN_CHUNKS = 4  # below this many chunks, work in this process


class Workers:
    """`map(fn, items)` in order, in `n` processes (started on first need) or in this
    process. At most 2n items are in flight, so a stream is read at most 2n chunks
    ahead of what has been written."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.pool: ProcessPoolExecutor | None = None

    def parallel(self, n_items: int) -> bool:
        """Whether `n_items` items go to the worker processes (else: this process)."""
        return self.n > 1 and n_items >= MIN_CHUNKS

    def map(self, fn: Callable, items: Iterable) -> Iterator:
        it = iter(items)
        head = list(itertools.islice(it, MIN_CHUNKS))
        if not self.parallel(len(head)):
            yield from map(fn, itertools.chain(head, it))
            return
        pool = self._start()
        pending: collections.deque[Future] = collections.deque()
        for item in itertools.chain(head, it):
            pending.append(pool.submit(fn, item))
            if len(pending) >= 2 * self.n:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()

    def _start(self) -> ProcessPoolExecutor:
        """The pool, its processes started with SIGINT blocked (they inherit the mask and
        never see Ctrl-C; a Ctrl-C meanwhile reaches this process once unblocked)."""
        if self.pool is None:
            main = threading.current_thread() is threading.main_thread()
            if main:
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                self.pool = ProcessPoolExecutor(self.n, multiprocessing.get_context("spawn"))
                for f in [self.pool.submit(int) for _ in range(self.n)]:  # start every process now
                    f.result()
            finally:
                if main:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        return self.pool

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
            self.pool = None

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
