"""Encoding a cleaned split into the prepared-data cache, chunk by chunk.

Each chunk of a `clean_split.CleanSplit` is encoded by SentencePiece (in the `Workers`
processes, or in this process with `data.num_proc` threads), length-filtered (training
splits) and appended to one Arrow file, which training memory-maps
(`datasets.Dataset.from_file`). Columns: `src`, `tgt` (the normalised text), `src_ids`,
`tgt_ids` (no BOS/EOS). With subword sampling (`subword_sampling.Sampling`), a second
file beside it holds each training pair's sampled segmentations, row-aligned.
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
from transformer.data.subword_sampling import SAMPLES, Sampling, sample_segmentations
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
    """An encoded split: one Arrow file, written chunk by chunk; with `sampling`, its pairs'
    sampled segmentations in a second one beside it (`SAMPLES`)."""

    def __init__(self, path: Path, sampling: Sampling | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.sampling = sampling
        self.writers = [ArrowWriter(path=str(path), features=FEATURES)]
        if sampling is not None:
            features = datasets.Features({c: datasets.Sequence(datasets.Sequence(datasets.Value("int32")))
                                          for c in sampling.columns()})
            self.writers.append(ArrowWriter(path=str(path.parent / SAMPLES), features=features))

    def __enter__(self) -> SplitWriter:
        return self

    def __exit__(self, *exc) -> None:
        for writer in self.writers:
            if exc[0] is None:
                writer.finalize()
            writer.close()

    def _append(self, rows: pa.Table, ids: list[pa.Array], length_filter: LengthFilter | None,
                counts: dict[str, int]) -> int:
        """Write a chunk's rows with their ids, length-filtered (a training split), counting
        what each rule drops into `counts`; returns the pairs written."""
        chunks = [pa.table([*rows.columns, *ids[:2]], names=list(FEATURES))]
        if self.sampling is not None:
            chunks.append(pa.table(ids[2:], names=self.sampling.columns()))
        if length_filter is not None:
            src_lens, tgt_lens = (pc.list_value_length(x).to_numpy(zero_copy_only=False) for x in ids[:2])
            keep, dropped = corpus.length_filter(src_lens, tgt_lens, length_filter.max_len,
                                                 length_filter.max_len_ratio)
            for rule, n in dropped.items():
                counts[rule] += n
            chunks = [c.take(keep) if len(keep) < len(c) else c for c in chunks]
        for writer, chunk in zip(self.writers, chunks, strict=True):
            writer.write_table(chunk)
        return len(chunks[0])

    def write(self, split: CleanSplit, tokenizer: Tokenizer, workers: Workers, num_threads: int,
              length_filter: LengthFilter | None = None, label: str = "dev") -> int:
        """Append `split` encoded; returns the pairs written. `num_threads` SentencePiece
        threads when the chunks are encoded in this process (one in each worker); a line
        every few seconds says how far it is, naming the split (`label`, or the length
        filter's)."""
        ranges = list(split.row_ranges())
        threads = 1 if workers.parallel(len(ranges)) else num_threads
        model = tokenizer.digest, tokenizer.proto
        tasks = ((*model, threads, *r, self.sampling) for r in ranges)
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


def encode_rows(task: tuple[str, bytes, int, str, int, int, Sampling | None]) -> list[pa.Array]:
    """Source and target ids (list<int32> arrays) of rows [start, stop) of a cleaned split
    file, then with `sampling` the sampled segmentations of its sides (list<list<int32>>);
    task = (tokenizer digest, its model, threads, path, start, stop, sampling)."""
    digest, proto, threads, path, start, stop, sampling = task
    if digest not in _TOKENIZERS:
        _TOKENIZERS[digest] = Tokenizer.from_proto(proto)
    tokenizer = _TOKENIZERS[digest]
    rows = read_table(path).slice(start, stop - start)
    texts = {side: rows.column(side).to_pylist() for side in ("src", "tgt")}
    best = {side: tokenizer.encode(texts[side], threads) for side in texts}
    samples = [sample_segmentations(tokenizer, texts[side], best[side], sampling, [start, side == "tgt"])
               for side in (sampling.sides if sampling is not None else ())]
    return [*(pa.array(best[side], IDS) for side in ("src", "tgt")), *samples]
