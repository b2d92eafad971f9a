"""A corpus read, cleaned and hashed as a stream, and kept on disk as Arrow.

Preparation never holds a corpus in memory: its pairs are read in chunks of `CHUNK_PAIRS`,
cleaned (`corpus.normalize`, pairs with an empty side dropped), hashed as they pass
(`corpus.Digest`, the content key of the prepared-data cache) and appended to an Arrow
file, whose memory map then serves the vocabulary's sample (`CleanSplit.take`) and the
encoding (`CleanSplit.batches`). Memory stays at a few chunks' worth, whatever the size of
the corpus (the old in-memory pipeline's Python lists took about 1.6 GB per million pairs).

`Workers` spreads the chunks over processes (`data.num_proc`): the main process reads
and writes, in order; the workers clean, and later encode, one chunk each at a time.
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import multiprocessing
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from transformer import corpus
from transformer.config import DataConfig
from transformer.corpus import DataError, Pairs

log = logging.getLogger(__name__)

CHUNK_PAIRS = 50_000
SCHEMA = pa.schema([("src", pa.string()), ("tgt", pa.string())])


class Workers:
    """`map` in order over a stream, in `n` processes when there is more than one chunk
    (started on first need: a small corpus never pays for them), or in this process.
    At most 2n chunks are in flight, so the stream is never read ahead."""

    def __init__(self, n: int, initializer: Callable | None = None, initargs: tuple = ()) -> None:
        self.n, self.initializer, self.initargs = n, initializer, initargs
        self.pool: ProcessPoolExecutor | None = None
        if initializer is not None:  # the in-process path uses the same state
            initializer(*initargs, inline=True)

    def map(self, fn: Callable, items: Iterable) -> Iterator:
        it = iter(items)
        head = list(itertools.islice(it, 2))
        if self.n <= 1 or len(head) < 2:
            yield from map(fn, itertools.chain(head, it))
            return
        if self.pool is None:  # spawn: this process may hold torch's OpenMP threads
            init = functools.partial(self.initializer, inline=False) if self.initializer else None
            self.pool = ProcessPoolExecutor(self.n, multiprocessing.get_context("spawn"),
                                            initializer=init, initargs=self.initargs)
        pending: collections.deque[Future] = collections.deque()
        for item in itertools.chain(head, it):
            pending.append(self.pool.submit(fn, item))
            if len(pending) >= 2 * self.n:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
            self.pool = None

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class CleanSplit:
    """A cleaned split on disk: `pairs` kept of `raw` read, `empty` dropped for an empty side."""

    path: Path
    pairs: int
    raw: int
    empty: int
    digest: str  # corpus.Digest of the kept pairs
    origin: str  # where they came from, for messages

    def __len__(self) -> int:
        return self.pairs

    def table(self) -> pa.Table:
        """The whole split, memory-mapped (no copy)."""
        return read_table(self.path)

    def row_ranges(self) -> Iterator[tuple[str, int, int]]:
        """(path, start, stop) of each chunk: what a worker needs to read it."""
        for start in range(0, self.pairs, CHUNK_PAIRS):
            yield str(self.path), start, min(start + CHUNK_PAIRS, self.pairs)

    def take(self, rows: np.ndarray) -> Pairs:
        """The pairs at `rows` (sorted, for a memory map read front to back)."""
        t = self.table().take(pa.array(rows, type=pa.int64()))
        return Pairs(t.column("src").to_pylist(), t.column("tgt").to_pylist(), self.origin)

    def sentences(self, k: int, seed: int = 0) -> list[str]:
        """Every source then every target sentence, or a seeded uniform sample of `k` of
        them in that order: the text a corpus's own vocabulary is trained on."""
        n = self.pairs
        if 2 * n <= k:
            picked = np.arange(2 * n)
        else:
            picked = np.sort(np.random.default_rng(seed).choice(2 * n, k, replace=False))
        on_src = picked < n
        return self.take(picked[on_src]).src + self.take(picked[~on_src] - n).tgt


def read_table(path: str | Path) -> pa.Table:
    """An Arrow stream file, memory-mapped."""
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_stream(source).read_all()


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def clean_chunk(chunk: list[tuple[str, str]]) -> tuple[pa.RecordBatch, int]:
    """Normalised pairs of a chunk without those with an empty side, and how many were read."""
    kept = [(s, t) for s, t in ((corpus.normalize(s), corpus.normalize(t)) for s, t in chunk) if s and t]
    src, tgt = ([p[0] for p in kept], [p[1] for p in kept])
    return pa.record_batch([pa.array(src, pa.string()), pa.array(tgt, pa.string())], schema=SCHEMA), len(chunk)


def write_clean(pairs: Iterable[tuple[str, str]], path: Path, origin: str, label: str,
                workers: Workers | None = None) -> CleanSplit:
    """Clean `pairs` into an Arrow file at `path`; an empty result is a DataError naming
    `label` (the split) and `origin`."""
    digest, raw, kept = corpus.Digest(), 0, 0
    cleaned = (workers or Workers(1)).map(clean_chunk, _chunks(pairs, CHUNK_PAIRS))
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, SCHEMA) as writer:
        for batch, n_read in cleaned:
            raw += n_read
            if batch.num_rows:
                digest.update_arrays(batch.column(0), batch.column(1))
                kept += batch.num_rows
                writer.write_batch(batch)
    log.info("%s: dropped %d of %d pairs with an empty side", label, raw - kept, raw)
    if not kept:
        raise DataError(f"{label} split is empty after cleaning ({raw} pairs read from {origin})")
    return CleanSplit(path, kept, raw, raw - kept, digest.hexdigest(), origin)


class _HeldOutTail:
    """The training pairs of a corpus without a dev set, all but its tail: the last
    `max(1, min(2000, n // 50))` of its n pairs, kept in `tail` once the stream ends.
    Only the last 2,000 pairs are ever held back, whatever n is."""

    MAX = 2000

    def __init__(self, pairs: Iterable[tuple[str, str]]) -> None:
        self.pairs, self.tail, self.count = pairs, [], 0

    def __iter__(self) -> Iterator[tuple[str, str]]:
        window: list[tuple[str, str]] = []
        for pair in self.pairs:
            self.count += 1
            window.append(pair)
            if len(window) > 2 * self.MAX:  # emit the older half: the tail is within the newer
                yield from window[: self.MAX]
                del window[: self.MAX]
        n_dev = max(1, min(self.MAX, self.count // 50))
        self.tail = window[len(window) - n_dev :]
        yield from window[: len(window) - n_dev]


def clean_corpus(cfg: DataConfig, folder: Path, prefix: str = "",
                 workers: Workers | None = None) -> dict[str, CleanSplit]:
    """The `train` and `dev` splits of one corpus, cleaned into `folder`; `prefix` names
    the corpus in a mix (`/europarl`), for messages."""
    train, origin = corpus.iter_split(cfg, "train")
    held = whole = None
    if cfg.name == "files" and not cfg.dev_src:
        held = _HeldOutTail(train)
        train = whole = iter(held)
    if cfg.max_train_pairs is not None:
        train = itertools.islice(train, cfg.max_train_pairs)
    name = prefix.replace("/", "-")
    out = {"train": write_clean(train, folder / f"train{name}.arrow", origin, f"train{prefix}", workers)}
    if held is not None:
        for _ in whole:  # the tail is known at the end (read on past max_train_pairs)
            pass
        log.warning("no dev_src given: holding out the last %d training pairs as dev", len(held.tail))
        dev, dev_origin = iter(held.tail), f"{origin} (tail)"
    else:
        dev, dev_origin = corpus.iter_split(cfg, "dev")
    out["dev"] = write_clean(dev, folder / f"dev{name}.arrow", dev_origin, f"dev{prefix}", workers)
    return out
