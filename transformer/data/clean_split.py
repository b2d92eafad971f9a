"""A corpus read, cleaned and hashed as a stream, and kept on disk as Arrow.

Preparation never holds a corpus in memory: its pairs are read in chunks of `CHUNK_PAIRS`,
cleaned (`corpus.clean`), hashed as they pass (`corpus.Digest`, the content key of the
prepared-data cache) and appended to an Arrow file, whose memory map then serves the
vocabulary's sample (`CleanSplit.take`) and the encoding (`encode_split.SplitWriter`).
Memory stays at a few chunks' worth, whatever the size of the corpus (the pairs as Python
lists would take about 1.6 GB per million). With `data.num_proc` > 1
the chunks are cleaned in worker processes (`workers.Workers`), in order.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from transformer.config import DataConfig
from transformer.data import corpus
from transformer.data.corpus import DataError, HeldOutTail
from transformer.data.workers import Workers

log = logging.getLogger(__name__)

CHUNK_PAIRS = 50_000
SCHEMA = pa.schema([("src", pa.string()), ("tgt", pa.string())])


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

    def take(self, rows: np.ndarray, side: str) -> list[str]:
        """The `side` ("src" or "tgt") sentences at `rows` (sorted), read batch by batch
        from the memory map (a take on the whole table would first copy the column)."""
        rows = np.asarray(rows, dtype=np.int64)
        out: list[str] = []
        start = 0
        for batch in self.table().column(side).chunks:
            lo, hi = np.searchsorted(rows, [start, start + len(batch)])
            if hi > lo:
                out += batch.take(pa.array(rows[lo:hi] - start)).to_pylist()
            start += len(batch)
        return out

    def sentences(self, k: int, seed: int = 0) -> list[str]:
        """Every source then every target sentence, or a seeded uniform sample of `k` of
        them in that order: the text a corpus's own vocabulary is trained on."""
        n = self.pairs
        if 2 * n <= k:
            picked = np.arange(2 * n)
        else:
            picked = np.sort(np.random.default_rng(seed).choice(2 * n, k, replace=False))
        return self.take(picked[picked < n], "src") + self.take(picked[picked >= n] - n, "tgt")


def read_table(path: str | Path) -> pa.Table:
    """An Arrow stream file, memory-mapped."""
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_stream(source).read_all()


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def clean_chunk(chunk: list[tuple[str, str]]) -> tuple[pa.RecordBatch, int]:
    """A chunk's pairs cleaned (`corpus.clean`) as a record batch, and how many were read."""
    src, tgt = corpus.clean([s for s, _ in chunk], [t for _, t in chunk])
    return pa.record_batch([pa.array(src, pa.string()), pa.array(tgt, pa.string())], schema=SCHEMA), len(chunk)


def write_clean(pairs: Iterable[tuple[str, str]], path: Path, origin: str, label: str,
                workers: Workers) -> CleanSplit:
    """Clean `pairs` into an Arrow file at `path`; an empty result is a DataError naming
    `label` (the split) and `origin`."""
    digest, raw, kept = corpus.Digest(), 0, 0
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, SCHEMA) as writer:
        for batch, n_read in workers.map(clean_chunk, _chunks(pairs, CHUNK_PAIRS)):
            raw += n_read
            if batch.num_rows:
                digest.update_arrays(batch.column(0), batch.column(1))
                kept += batch.num_rows
                writer.write_batch(batch)
    log.info("%s: dropped %d of %d pairs with an empty side", label, raw - kept, raw)
    if not kept:
        raise DataError(f"{label} split is empty after cleaning ({raw} pairs read from {origin})")
    return CleanSplit(path, kept, raw, raw - kept, digest.hexdigest(), origin)


def clean_corpus(cfg: DataConfig, folder: Path, prefix: str, workers: Workers) -> dict[str, CleanSplit]:
    """The `train` and `dev` splits of one corpus, cleaned into `folder`; `prefix` names
    the corpus in a mix (`/europarl`), for messages."""
    whole, origin = corpus.iter_split(cfg, "train")
    held = None
    if cfg.name == "files" and not cfg.dev_src:
        held = HeldOutTail(whole)
        whole = iter(held)
    train = whole if cfg.max_train_pairs is None else itertools.islice(whole, cfg.max_train_pairs)
    name = prefix.replace("/", "-")
    out = {"train": write_clean(train, folder / f"train{name}.arrow", origin, f"train{prefix}", workers)}
    for _ in whole:  # past max_train_pairs: still read to the end, for its errors (and tail)
        pass
    if held is not None:
        dev, dev_origin = iter(held.tail), f"{origin} (tail)"
    else:
        dev, dev_origin = corpus.iter_split(cfg, "dev")
    out["dev"] = write_clean(dev, folder / f"dev{name}.arrow", dev_origin, f"dev{prefix}", workers)
    return out
