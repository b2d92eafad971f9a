"""A corpus read, cleaned and hashed as a stream, and kept on disk as Arrow.

Preparation never holds a corpus in memory: its pairs are read in chunks of `CHUNK_PAIRS`,
cleaned (`corpus.clean`), hashed as they pass (`corpus.Digest`, the content key of the
prepared-data cache) and appended to an Arrow file, whose memory map then serves the
vocabulary's sample (`CleanSplit.take`) and the encoding (`encode_split.SplitWriter`).
Memory stays at a few chunks' worth, whatever the size of the corpus (the pairs as Python
lists would take about 1.6 GB per million). With `data.num_proc` > 1
the chunks are cleaned in worker processes (`workers.Workers`), in order. A training
split is filtered there too, by the rules of `data.filters` (`filters.py`), but for
`dedup`, which runs here over the chunks in order.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from transformer.config import DataConfig, FilterConfig
from transformer.data import corpus
from transformer.data.corpus import DataError, HeldOutTail
from transformer.data.filters import RULES, Dedup, chunk_filter
from transformer.data.workers import Workers

log = logging.getLogger(__name__)

CHUNK_PAIRS = 50_000
SCHEMA = pa.schema([("src", pa.string()), ("tgt", pa.string())])


@dataclass
class CleanSplit:
    """A cleaned split on disk: `pairs` kept of `raw` read, `empty` dropped for an empty
    side, and `filtered` by each rule of `data.filters` that ran (a training split)."""

    path: Path
    pairs: int
    raw: int
    empty: int
    digest: str  # corpus.Digest of the kept pairs
    origin: str  # where they came from, for messages
    filtered: dict[str, int] = field(default_factory=dict)

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


# What each filter's line in the log says it dropped.
WHY = {"char_ratio": "one side over data.filters.char_ratio times as long as the other",
       "numbers": "numbers that differ between the sides", "script": "letters outside the Latin script",
       "langid": "a side identified as another language", "dedup": "a duplicate of an earlier pair"}


def clean_chunk(task: tuple[list[tuple[str, str]], FilterConfig | None, tuple[str, str]]
                ) -> tuple[pa.RecordBatch, int, dict[str, int]]:
    """A chunk's pairs cleaned (`corpus.clean`) and filtered (all `data.filters` but dedup)
    as a record batch, how many were read, and how many were dropped by each rule (`empty`
    first); task = (chunk, filters or None, the source and target languages)."""
    chunk, filters, langs = task
    src, tgt = corpus.clean([s for s, _ in chunk], [t for _, t in chunk])
    dropped = {"empty": len(chunk) - len(src)}
    if filters is not None and filters.active():
        rows, counts = chunk_filter(src, tgt, filters, langs)
        dropped.update(counts)
        if len(rows) < len(src):
            src, tgt = [src[i] for i in rows], [tgt[i] for i in rows]
    return pa.record_batch([pa.array(src, pa.string()), pa.array(tgt, pa.string())], schema=SCHEMA), len(chunk), dropped


def write_clean(pairs: Iterable[tuple[str, str]], path: Path, origin: str, label: str,
                workers: Workers, filters: FilterConfig | None = None, langs: tuple[str, str] = ("it", "en"),
                ) -> CleanSplit:
    """Clean `pairs` into an Arrow file at `path`, filtered by `filters` (in the languages
    `langs`) if given; an empty result is a DataError naming `label` (the split) and `origin`."""
    digest, raw, kept = corpus.Digest(), 0, 0
    dedup = Dedup(filters.dedup, label) if filters is not None and filters.dedup else None
    counts: dict[str, int] = {}
    tasks = ((chunk, filters, langs) for chunk in _chunks(pairs, CHUNK_PAIRS))
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, SCHEMA) as writer:
        for batch, n_read, dropped in workers.map(clean_chunk, tasks):
            raw += n_read
            if dedup is not None:
                keep = dedup.keep(batch.column(0).to_pylist(), batch.column(1).to_pylist())
                dropped["dedup"] = int(len(keep) - keep.sum())
                batch = batch.filter(pa.array(keep)) if not keep.all() else batch
            for rule, n in dropped.items():
                counts[rule] = counts.get(rule, 0) + n
            if batch.num_rows:
                digest.update_arrays(batch.column(0), batch.column(1))
                kept += batch.num_rows
                writer.write_batch(batch)
    empty = counts.pop("empty", 0)
    log.info("%s: dropped %d of %d pairs with an empty side", label, empty, raw)
    for rule in (r for r in RULES if r in counts):
        why = "the target of an earlier pair" if rule == "dedup" and dedup and dedup.mode == "target" else WHY[rule]
        log.info("%s: data.filters.%s dropped %d of %d pairs (%s)", label, rule, counts[rule], raw, why)
    if not kept:
        after = "cleaning and data.filters" if counts else "cleaning"
        raise DataError(f"{label} split is empty after {after} ({raw} pairs read from {origin})")
    return CleanSplit(path, kept, raw, empty, digest.hexdigest(), origin, counts)


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
    out = {"train": write_clean(train, folder / f"train{name}.arrow", origin, f"train{prefix}", workers,
                                cfg.filters, (cfg.src_lang, cfg.tgt_lang))}
    for _ in whole:  # past max_train_pairs: still read to the end, for its errors (and tail)
        pass
    if held is not None:
        dev, dev_origin = iter(held.tail), f"{origin} (tail)"
    else:
        dev, dev_origin = corpus.iter_split(cfg, "dev")
    out["dev"] = write_clean(dev, folder / f"dev{name}.arrow", dev_origin, f"dev{prefix}", workers)
    return out
