"""Encoding a cleaned split into the prepared-data cache, chunk by chunk.

Each chunk of a `clean_split.CleanSplit` is encoded by SentencePiece (in the `Workers`
processes, or in this process with `data.num_proc` threads), length-filtered (training
splits) and appended to one Arrow file, which training memory-maps
(`datasets.Dataset.from_file`). Columns: `src`, `tgt` (the normalised text), `src_ids`,
`tgt_ids` (no BOS/EOS).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.compute as pc
from datasets.arrow_writer import ArrowWriter

from transformer.data import corpus
from transformer.data.clean_split import CleanSplit, read_table
from transformer.data.corpus import DataError
from transformer.data.heartbeat import Heartbeat
from transformer.data.tokenizer import Tokenizer
from transformer.data.workers import Workers

log = logging.getLogger(__name__)

ARROW = "data.arrow"  # a split's file in its folder of the cache
IDS = pa.list_(pa.int32())
FEATURES = datasets.Features(
    {
        "src": datasets.Value("string"),
        "tgt": datasets.Value("string"),
        "src_ids": datasets.Sequence(datasets.Value("int32")),
        "tgt_ids": datasets.Sequence(datasets.Value("int32")),
    }
)


@dataclass
class LengthFilter:
    """Keep pairs within `max_len` tokens a side and `max_len_ratio` of each other; count
    what each rule drops into `dropped` (the split's entry of the statistics)."""

    max_len: int
    max_len_ratio: float
    label: str  # the split, for messages: `train`, `train/europarl`
    dropped: dict


class SplitWriter:
    """An encoded split: one Arrow file, written chunk by chunk."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.writer = ArrowWriter(path=str(path), features=FEATURES)

    def __enter__(self) -> SplitWriter:
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.writer.finalize()
        self.writer.close()

    def _append(self, rows: pa.Table, ids: list[pa.Array], length_filter: LengthFilter | None,
                counts: dict[str, int]) -> int:
        """Write a chunk's rows with their ids, length-filtered (a training split), counting
        what each rule drops into `counts`; returns the pairs written."""
        chunk = pa.table([*rows.columns, *ids], names=list(FEATURES))
        if length_filter is not None:
            src_lens, tgt_lens = (pc.list_value_length(x).to_numpy(zero_copy_only=False) for x in ids)
            keep, dropped = corpus.length_filter(src_lens, tgt_lens, length_filter.max_len,
                                                 length_filter.max_len_ratio)
            for rule, n in dropped.items():
                counts[rule] += n
            chunk = chunk.take(keep) if len(keep) < len(chunk) else chunk
        self.writer.write_table(chunk)
        return len(chunk)

    def write(self, split: CleanSplit, tokenizer: Tokenizer, workers: Workers, num_threads: int,
              length_filter: LengthFilter | None = None, label: str = "dev") -> int:
        """Append `split` encoded; returns the pairs written. `num_threads` SentencePiece
        threads when the chunks are encoded in this process (one in each worker); a line
        every few seconds says how far it is, naming the split (`label`, or the length
        filter's)."""
        ranges = list(split.row_ranges())
        threads = 1 if workers.parallel(len(ranges)) else num_threads
        model = tokenizer.digest, tokenizer.proto
        tasks = ((*model, threads, *r) for r in ranges)
        table = split.table()
        written, counts = 0, {"too_long": 0, "length_ratio": 0}
        name, done = length_filter.label if length_filter is not None else label, [0]
        with Heartbeat(lambda: f"encoding {name}: {done[0]:,} of {len(split):,} pairs", logger=log):
            for (_, start, stop), ids in zip(ranges, workers.map(encode_rows, tasks), strict=True):
                written += self._append(table.slice(start, stop - start), ids, length_filter, counts)
                done[0] = stop
        if length_filter is not None:
            f = length_filter
            for rule, n in counts.items():
                log.info("%s: dropped %d of %d pairs by rule %s", f.label, n, len(split), rule)
            f.dropped.update(counts)
            if not written:
                raise DataError(f"{f.label} split is empty after the length filters (data.max_len={f.max_len}, "
                                f"data.max_len_ratio={f.max_len_ratio}; {split.origin})")
        return written


_TOKENIZERS: dict[str, Tokenizer] = {}  # a process's tokenizers, by digest: one load per worker


def encode_rows(task: tuple[str, bytes, int, str, int, int]) -> list[pa.Array]:
    """Source and target ids (list<int32> arrays) of rows [start, stop) of a cleaned split
    file; task = (tokenizer digest, its model, threads, path, start, stop)."""
    digest, proto, threads, path, start, stop = task
    if digest not in _TOKENIZERS:
        _TOKENIZERS[digest] = Tokenizer.from_proto(proto)
    tokenizer = _TOKENIZERS[digest]
    rows = read_table(path).slice(start, stop - start)
    return [pa.array(tokenizer.encode(rows.column(side).to_pylist(), threads), IDS) for side in ("src", "tgt")]
