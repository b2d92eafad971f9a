"""Token-based batches with length bucketing, as fairseq makes them, and their collation.

Shapes: B batch, S source len, T target len (incl. the BOS/EOS that `collate` adds).

A batch holds as many pairs as fit in `max_tokens` padded tokens per side:
`B * max(S, T) <= max_tokens`. Pairs of similar length are batched together (sorted
inside shuffled chunks of `bucket_chunk` batches' worth), so little of a batch is padding.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow.compute as pc
import torch

from transformer.data.mixture import CorpusMixture
from transformer.data.subword_sampling import expanded_rows

# Tokens collate adds to each side: nothing to the source, BOS (tgt_in) or EOS (tgt_out)
# to the target. Batch sizes are computed on these padded lengths.
SRC_EXTRA = 0
TGT_EXTRA = 1


@dataclass
class Batch:
    """A padded batch, as `collate` builds it on the host.

    `predict_index` (N,) holds the flat positions (row-major in (B, T)) of the real target
    tokens, the positions the loss predicts: `collate` computes it on the host, so the
    model picks those rows with `index_select` and the trainer knows N (`n_tgt_tokens`,
    its length) without reading anything back from the device. A batch built by hand
    gets it from `tgt_out_ids` (a read of the values, free on a CPU tensor).
    """

    src_ids: torch.Tensor  # (B, S) long, right-padded
    tgt_in_ids: torch.Tensor  # (B, T) long: BOS + y, right-padded
    tgt_out_ids: torch.Tensor  # (B, T) long: y + EOS, right-padded
    pad_id: int = 0
    predict_index: torch.Tensor | None = None  # (N,) long: flat positions of tgt_out_ids != pad_id

    def __post_init__(self) -> None:
        if self.predict_index is None:
            self.predict_index = (self.tgt_out_ids != self.pad_id).flatten().nonzero().squeeze(1)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        move = lambda x: x.to(device, non_blocking=non_blocking)  # noqa: E731
        return Batch(move(self.src_ids), move(self.tgt_in_ids), move(self.tgt_out_ids), self.pad_id,
                     move(self.predict_index))

    def pin_memory(self) -> Batch:
        """Page-locked copies (DataLoader(pin_memory=True), the trainer's prefetcher on CUDA),
        so that `to(cuda, non_blocking=True)` is an asynchronous copy."""
        pin = lambda x: x.pin_memory()  # noqa: E731
        return Batch(pin(self.src_ids), pin(self.tgt_in_ids), pin(self.tgt_out_ids), self.pad_id,
                     pin(self.predict_index))

    def __len__(self) -> int:
        return self.src_ids.size(0)

    @property
    def n_src_tokens(self) -> int:
        """Real (non-padding) source tokens (a read of the values)."""
        return int((self.src_ids != self.pad_id).sum())

    @property
    def n_tgt_tokens(self) -> int:
        """Real target tokens predicted by the loss (y + EOS): a shape, never a read."""
        return self.predict_index.numel()


def collate(
    examples: Sequence[Mapping[str, Sequence[int]]] | Mapping[str, Sequence[Sequence[int]]],
    pad_id: int,
    bos_id: int,
    eos_id: int,
    pad_to_multiple: int = 1,
    vocab_size: int | None = None,
) -> Batch:
    """Pad a list of `{"src_ids", "tgt_ids"}` examples (or one dict of such lists) to a Batch.

    Args:
        pad_to_multiple: pad both lengths up to a multiple of this (8 on a GPU: few distinct
            shapes for `torch.compile`, tensor-core-friendly sizes; 1: no extra padding).
        vocab_size: if given, ids outside [0, vocab_size) are a ValueError here, on the
            host, before the batch reaches a device (where the model does not check them).
    """
    if isinstance(examples, Mapping):  # dataset[indices] gives columns
        srcs, tgts = examples["src_ids"], examples["tgt_ids"]
    else:
        srcs = [ex["src_ids"] for ex in examples]
        tgts = [ex["tgt_ids"] for ex in examples]
    return collate_flat(_flatten(srcs), _flatten(tgts), pad_id, bos_id, eos_id, pad_to_multiple, vocab_size)


def collate_flat(
    src: tuple[np.ndarray, np.ndarray], tgt: tuple[np.ndarray, np.ndarray], pad_id: int, bos_id: int,
    eos_id: int, pad_to_multiple: int = 1, vocab_size: int | None = None,
) -> Batch:
    """`collate` of sequences given as (flat ids, lengths) numpy arrays per side, e.g. rows
    gathered from Arrow buffers by `TokenIds.take`: numpy array operations only."""
    src_ids = _pad(*src, pad_id, offset=0, extra=SRC_EXTRA, multiple=pad_to_multiple, vocab_size=vocab_size)
    tgt_flat, tgt_lens = tgt
    tgt_in_ids = _pad(tgt_flat, tgt_lens, pad_id, offset=1, extra=TGT_EXTRA, multiple=pad_to_multiple,
                      vocab_size=vocab_size)
    tgt_in_ids[:, 0] = bos_id
    width = tgt_in_ids.shape[1]
    # y + EOS is BOS + y shifted left by one: the same row-major array, one element on
    tgt_out_ids = np.empty_like(tgt_in_ids)
    tgt_out_ids.reshape(-1)[:-1] = tgt_in_ids.reshape(-1)[1:]
    tgt_out_ids[:, -1] = pad_id  # the next row's BOS, and the last row's end
    tgt_out_ids[np.arange(len(tgt_lens)), tgt_lens] = eos_id
    # y + EOS of row i sit at [0, len_i]: their flat positions, in row-major order
    predict_index = np.flatnonzero(np.arange(width)[None, :] <= tgt_lens[:, None])
    return Batch(torch.from_numpy(src_ids), torch.from_numpy(tgt_in_ids), torch.from_numpy(tgt_out_ids),
                 pad_id, torch.from_numpy(predict_index))


def _flatten(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Id lists -> (flat int64 ids, int64 lengths)."""
    lens = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=int(lens.sum()))
    return flat, lens


def _pad(
    flat: np.ndarray, lens: np.ndarray, pad_id: int, offset: int, extra: int, multiple: int = 1,
    vocab_size: int | None = None,
) -> np.ndarray:
    """(B, width) int64 array with row i's ids (flat[sum(lens[:i]):][:lens[i]]) at
    [offset, offset + len_i). width is max_len + extra rounded up to `multiple`.

    Vectorised in numpy (one boolean-mask assignment): a Python loop over rows, or the same
    in torch with its thread pool, is far slower (docs/results/code-figures.md, "Figures behind the
    code's choices").
    """
    if vocab_size is not None and flat.size and (flat.min() < 0 or flat.max() >= vocab_size):
        raise ValueError(f"ids outside the vocabulary [0, {vocab_size}): min {flat.min()}, max {flat.max()}")
    width = -(-(int(lens.max()) + extra) // multiple) * multiple
    out = np.full((len(lens), width), pad_id, dtype=np.int64)
    positions = np.arange(out.shape[1])
    inside = (positions >= offset) & (positions < lens[:, None] + offset)  # row-major = flat order
    out[inside] = flat
    return out


class TokenIds:
    """The `src_ids` and `tgt_ids` of an encoded dataset as flat numpy arrays (each side's
    ids one after another, and where each row starts), read once from its Arrow buffers,
    so that a batch is gathered and padded by numpy array operations (`collate_rows`)
    rather than built from Python lists by `datasets` row by row, which holds the GIL the
    training loop needs to launch kernels. The ids are stored in the smallest integer type
    that holds the vocabulary (2 bytes a token below 32,768 ids) and every stored id.

    With subword sampling, `samples` (the cache's sampled segmentations, row-aligned with
    `dataset`) hold `segmentations` (K) of each pair on a side: the rows are then the
    pairs' segmentations, pair-major (row `pair * K + k`), and a side that was not sampled
    gives every segmentation of a pair its one best (`strides`).
    """

    def __init__(self, dataset, vocab_size: int, samples=None, segmentations: int = 1) -> None:
        table = dataset.with_format("arrow")[:]  # honours any select()/shuffle() indices
        sampled = samples.with_format("arrow")[:] if samples is not None else None
        dtype = np.int16 if vocab_size <= np.iinfo(np.int16).max + 1 else np.int32
        sides, self.strides = [], []
        for side in ("src", "tgt"):
            if sampled is not None and f"{side}_samples" in sampled.column_names:
                sides.append(self._flat(pc.list_flatten(sampled.column(f"{side}_samples")), dtype))
                self.strides.append(1)
            else:
                sides.append(self._flat(table.column(f"{side}_ids"), dtype))
                self.strides.append(segmentations)
        self.sides = tuple(sides)

    @staticmethod
    def _flat(column, dtype) -> tuple[np.ndarray, np.ndarray]:
        chunks = [c for c in column.chunks if len(c)]
        values = [c.flatten().to_numpy(zero_copy_only=False) for c in chunks]
        limits = np.iinfo(dtype)
        if any(v.size and (v.min() < limits.min or v.max() > limits.max) for v in values):
            dtype = np.int64  # ids `dtype` cannot hold (a damaged cache): kept, for collate's vocabulary check
        values = [v.astype(dtype, copy=False) for v in values]
        lens = [pc.list_value_length(c).to_numpy(zero_copy_only=False) for c in chunks]
        lens = np.concatenate(lens).astype(np.int64) if lens else np.zeros(0, np.int64)
        flat = np.concatenate(values) if values else np.zeros(0, dtype)
        return flat, np.concatenate([[0], np.cumsum(lens)])

    def __len__(self) -> int:
        return (len(self.sides[0][1]) - 1) * self.strides[0]

    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """Every row's source and target length, as `token_lengths` reads them."""
        src, tgt = (np.repeat(np.diff(starts), stride) for (_, starts), stride in zip(self.sides, self.strides))
        return src, tgt

    def take(self, rows: np.ndarray, side: int) -> tuple[np.ndarray, np.ndarray]:
        """(flat int64 ids, lengths) of `rows` on `side` (0 source, 1 target), in order."""
        flat, starts = self.sides[side]
        rows = rows // self.strides[side] if self.strides[side] > 1 else rows
        begin, lens = starts[rows], starts[rows + 1] - starts[rows]
        shift = np.repeat(begin - (np.cumsum(lens) - lens), lens)  # each row's start, minus its out start
        return flat[np.arange(int(lens.sum())) + shift].astype(np.int64), lens

    def collate_rows(self, rows: np.ndarray, pad_id: int, bos_id: int, eos_id: int, pad_to_multiple: int = 1,
                     vocab_size: int | None = None) -> Batch:
        """`collate` of dataset rows `rows` (an int array)."""
        return collate_flat(self.take(rows, 0), self.take(rows, 1), pad_id, bos_id, eos_id, pad_to_multiple,
                            vocab_size)


def pad(seqs: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    """Right-pad non-empty id lists to a (B, S) long tensor, as `collate` pads a source."""
    return torch.from_numpy(_pad(*_flatten(seqs), pad_id, offset=0, extra=0))


def length_batches(lengths: Sequence[int], max_tokens: int,
                   max_rows: int | None = None) -> list[list[int]]:
    """Indices grouped, longest first, so that rows * longest length <= max_tokens (decoding)
    and rows <= max_rows (None: no limit but max_tokens).

    A sentence longer than max_tokens gets a batch of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= max_tokens \
                and (max_rows is None or len(batches[-1]) < max_rows):
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def token_lengths(dataset) -> tuple[np.ndarray, np.ndarray]:
    """Lengths of `src_ids` and `tgt_ids` of an encoded datasets.Dataset, read from Arrow."""
    table = dataset.with_format("arrow")[:]  # honours any select()/shuffle() indices
    return tuple(
        pc.list_value_length(table.column(c)).to_numpy(zero_copy_only=False).astype(np.int64)
        for c in ("src_ids", "tgt_ids")
    )  # type: ignore[return-value]


class BatchPlan:
    """A list of batches of example indices, held as two numpy arrays: `rows`, every
    batch's indices one after another, and `bounds`, where each batch starts (and the
    last ends). An epoch's plan costs 8 bytes an example, not a Python list and an int
    object per example (about 70 bytes; 700 MB an epoch at 10M pairs).

    Indexing gives one batch as a list of ints (what `datasets` takes); a slice, e.g. a
    rank's share `plan[rank::world_size]`, gives another plan; iteration yields lists.
    """

    def __init__(self, rows: np.ndarray, bounds: np.ndarray) -> None:
        self.rows = np.asarray(rows, dtype=np.int64)
        self.bounds = np.asarray(bounds, dtype=np.int64)  # (n_batches + 1,), bounds[0] == 0

    @classmethod
    def from_lists(cls, batches: Sequence[Sequence[int]]) -> BatchPlan:
        lengths = np.fromiter(map(len, batches), dtype=np.int64, count=len(batches))
        rows = np.fromiter(itertools.chain.from_iterable(batches), dtype=np.int64, count=int(lengths.sum()))
        return cls(rows, np.concatenate([[0], np.cumsum(lengths)]))

    @property
    def lengths(self) -> np.ndarray:
        """Examples in each batch."""
        return np.diff(self.bounds)

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.take(np.arange(len(self))[i])
        if not -len(self) <= i < len(self):
            raise IndexError(f"batch {i} of {len(self)}")
        i %= len(self)
        return self.rows[self.bounds[i] : self.bounds[i + 1]].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        return (self[i] for i in range(len(self)))

    def rows_of(self, i: int) -> np.ndarray:
        """Batch i's example indices as an int64 array (a view)."""
        return self.rows[self.bounds[i] : self.bounds[i + 1]]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BatchPlan):
            return NotImplemented
        return np.array_equal(self.bounds, other.bounds) and np.array_equal(self.rows, other.rows)

    def tolist(self) -> list[list[int]]:
        return list(self)

    def take(self, order: np.ndarray) -> BatchPlan:
        """The batches `order` (indices into this plan), in that order."""
        order = np.asarray(order, dtype=np.int64)
        lengths = self.lengths[order]
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        # row k of new batch b is old row bounds[order[b]] + k: one gather for all batches
        shift = np.repeat(self.bounds[order] - bounds[:-1], lengths)
        return BatchPlan(self.rows[np.arange(bounds[-1]) + shift], bounds)


def cut_sorted(sizes: np.ndarray, max_tokens: int) -> np.ndarray:
    """Where a greedy cut of examples sorted by non-decreasing padded size starts each batch
    (and the last ends): a batch [j, k) holds as many as fit, (k - j) * sizes[k - 1] <=
    max_tokens. One step per batch, not per example: since the sizes do not decrease, the
    cost of taking the first n is increasing in n, and a binary search finds where it
    passes max_tokens."""
    bounds, j, m = [0], 0, len(sizes)
    while j < m:
        window = sizes[j : j + max(1, max_tokens // int(sizes[j]))]  # no more can fit
        cost = np.arange(1, len(window) + 1) * window
        j += max(1, int(np.searchsorted(cost, max_tokens, side="right")))
        bounds.append(j)
    return np.asarray(bounds, dtype=np.int64)


class TokenBatchSampler:
    """Batches of example indices with at most `max_tokens` padded tokens per side.

    Each epoch: shuffle the indices (seeded by seed and epoch), sort chunks of about
    `bucket_chunk` batches' worth of examples by length, cut them greedily into batches,
    then shuffle the batches. With `world_size > 1` every rank computes the same global
    list and takes every `world_size`-th batch; the list is first made a multiple of
    `world_size` by halving the largest batches, so no pair is dropped and all ranks get
    the same number of batches (DDP would hang otherwise). `continue_epoch` makes an epoch
    the pairs an earlier batching of it left unseen (a resume with other settings).

    `src_lens`/`tgt_lens` are token counts without BOS/EOS (see `token_lengths`).
    With a `mixture` (several corpora, weighted), an epoch is the mixture's draw of rows
    instead of a permutation of all of them. An epoch's batches are a `BatchPlan` (numpy
    arrays, nothing per example in Python). Usable as a DataLoader `batch_sampler` after
    `set_epoch(epoch, start)`. With `pad_to_multiple` (as given to `collate`) the budget
    counts the lengths rounded up, so a padded batch still holds at most `max_tokens`.
    With `segmentations` K > 1 (subword sampling), the rows are K segmentations of each
    pair, pair-major: an epoch draws pairs, each takes the row of its segmentation for the
    epoch (`subword_sampling.expanded_rows`), and the batches are planned on those rows'
    own lengths.
    """

    def __init__(
        self,
        src_lens: Sequence[int] | np.ndarray,
        tgt_lens: Sequence[int] | np.ndarray,
        max_tokens: int,
        seed: int = 1,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
        bucket_chunk: int = 100,
        mixture: CorpusMixture | None = None,
        pad_to_multiple: int = 1,
        segmentations: int = 1,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world_size {world_size}")
        # int32: lengths are at most data.max_len; 4 bytes an example and side
        src = np.asarray(src_lens, dtype=np.int32) + SRC_EXTRA
        tgt = np.asarray(tgt_lens, dtype=np.int32) + TGT_EXTRA
        if len(src) != len(tgt) or len(src) == 0:
            raise ValueError(
                f"need as many source as target lengths, got {len(src)} and {len(tgt)}"
            )
        # padded tokens one example costs per row, as `collate(pad_to_multiple=...)` pads it
        self.sizes = -(-np.maximum(src, tgt) // pad_to_multiple) * pad_to_multiple
        longest = int(self.sizes.argmax())
        if self.sizes[longest] > max_tokens:
            raise ValueError(
                f"example {longest} has {self.sizes[longest]} tokens (with BOS/EOS), more than "
                f"max_tokens={max_tokens}: raise max_tokens or lower data.max_len"
            )
        if len(src) % segmentations:
            raise ValueError(f"{len(src)} rows are not {segmentations} segmentations of each pair")
        self.segmentations, self.n_pairs = segmentations, len(src) // segmentations
        if mixture is not None and sum(mixture.sizes) != self.n_pairs:
            raise ValueError(f"the mixture covers {sum(mixture.sizes)} rows, the data has {self.n_pairs}")
        self.mixture = mixture
        self.src, self.tgt = src, tgt
        self.max_tokens, self.bucket_chunk, self.pad_to_multiple = max_tokens, bucket_chunk, pad_to_multiple
        self.seed, self.shuffle = seed, shuffle
        self.rank, self.world_size = rank, world_size
        mean_batch = max(1, int(max_tokens // self.sizes.mean()))
        self.chunk_size = max(1, bucket_chunk * mean_batch)  # examples sorted together
        self.epoch, self.start = 0, 0
        self._cache: tuple[int, BatchPlan] | None = None
        # an epoch that goes on with only some of its pairs (`continue_epoch`)
        self._rest: tuple[int, np.ndarray, list[int]] | None = None

    @property
    def settings(self) -> dict[str, int]:
        """What shapes the batches of an epoch, as a checkpoint records it (`epoch_resume`)."""
        return {"seed": self.seed, "max_tokens": self.max_tokens, "bucket_chunk": self.bucket_chunk,
                "pad_to_multiple": self.pad_to_multiple, "world_size": self.world_size, "pairs": len(self.sizes)}

    def epoch_order(self, epoch: int, seed: int | None = None) -> tuple[np.ndarray, np.random.Generator]:
        """The rows `epoch` draws, in the order it draws them (a permutation, or the
        mixture's draw), for `seed` (default: the sampler's); and the generator that then
        shuffles its batches."""
        seed = self.seed if seed is None else seed
        rng = np.random.default_rng([seed, epoch])
        if self.mixture is not None:
            mixture = self.mixture if seed == self.mixture.seed else self.mixture.reseeded(seed)
            pairs = mixture.epoch_indices(epoch)
        else:
            pairs = rng.permutation(self.n_pairs) if self.shuffle else np.arange(self.n_pairs)
        if self.segmentations == 1:
            return pairs, rng
        return expanded_rows(pairs, epoch, seed, self.n_pairs, self.segmentations), rng

    def plan_positions(self, order: np.ndarray, rng: np.random.Generator) -> BatchPlan:
        """The batches of the rows `order`, as positions in `order`: chunks of `chunk_size`
        sorted by length and cut greedily, made a multiple of world_size, shuffled by `rng`."""
        rows, bounds = [np.zeros(0, dtype=np.int64)], [np.zeros(1, dtype=np.int64)]
        for lo in range(0, len(order), self.chunk_size):
            chunk = np.arange(lo, min(lo + self.chunk_size, len(order)))
            # sort by padded size, then by source length, so neighbours pad each other least
            chunk = chunk[np.lexsort((self.src[order[chunk]], self.sizes[order[chunk]]))]
            rows.append(chunk)
            bounds.append(lo + cut_sorted(self.sizes[order[chunk]], self.max_tokens)[1:])
        plan = _split_to_multiple(BatchPlan(np.concatenate(rows), np.concatenate(bounds)), self.world_size)
        return plan.take(rng.permutation(len(plan))) if self.shuffle else plan

    def continue_epoch(self, epoch: int, order: np.ndarray, key: list[int]) -> None:
        """Make `epoch` only the rows `order` (what an earlier batching of it left unseen:
        `epoch_resume.continue_epoch`), their batches shuffled by a generator seeded with `key`."""
        self._rest, self._cache = (epoch, np.asarray(order, dtype=np.int64), list(key)), None

    def global_batches(self, epoch: int) -> BatchPlan:
        """All ranks' batches for `epoch`, in training order; rank r takes [r::world_size]."""
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        if self._rest is not None and self._rest[0] == epoch:
            order, rng = self._rest[1], np.random.default_rng(self._rest[2])
        else:
            order, rng = self.epoch_order(epoch)
        positions = self.plan_positions(order, rng)
        plan = BatchPlan(order[positions.rows], positions.bounds)
        self._cache = (epoch, plan)
        return plan

    def batches(self, epoch: int) -> BatchPlan:
        """This rank's batches for `epoch`; deterministic for (seed, epoch)."""
        plan = self.global_batches(epoch)
        return plan if self.world_size == 1 else plan[self.rank :: self.world_size]

    def iter_from(self, epoch: int, start: int = 0) -> Iterator[list[int]]:
        """Resume `epoch` at this rank's batch `start` (the number of batches already done)."""
        yield from self.batches(epoch)[start:]

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def __iter__(self) -> Iterator[list[int]]:
        return self.iter_from(self.epoch, self.start)

    def __len__(self) -> int:
        return len(self.batches(self.epoch)) - self.start


def _split_to_multiple(plan: BatchPlan, world_size: int) -> BatchPlan:
    """Halve the largest batches until their number is a multiple of world_size."""
    bounds = plan.bounds
    while (len(bounds) - 1) % world_size:
        lengths = np.diff(bounds)
        largest = int(lengths.argmax())  # the first of the largest
        if lengths[largest] < 2:  # only single-example batches left: nothing to split
            raise ValueError(
                f"cannot share {len(lengths)} single-example batches among {world_size} ranks"
            )
        bounds = np.insert(bounds, largest + 1, bounds[largest] + lengths[largest] // 2)
    return BatchPlan(plan.rows, bounds)


def padding_efficiency(
    batches: BatchPlan | Sequence[Sequence[int]], src_lens: Sequence[int], tgt_lens: Sequence[int]
) -> float:
    """Real tokens / padded tokens over both sides of `batches` (1.0 = no padding).

    Lengths are without BOS/EOS, as given to TokenBatchSampler; collate's extras count.
    """
    plan = batches if isinstance(batches, BatchPlan) else BatchPlan.from_lists(batches)
    if len(plan) == 0:
        return 1.0
    src = np.asarray(src_lens, dtype=np.int64)[plan.rows] + SRC_EXTRA
    tgt = np.asarray(tgt_lens, dtype=np.int64)[plan.rows] + TGT_EXTRA
    starts = plan.bounds[:-1]
    padded = plan.lengths * (np.maximum.reduceat(src, starts) + np.maximum.reduceat(tgt, starts))
    return int(src.sum() + tgt.sum()) / int(padded.sum())


def batching_statistics(
    src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, bucket_chunk: int,
    mixture: CorpusMixture | None = None, segmentations: int = 1,
) -> dict:
    """Batches per epoch, pairs per batch and padding efficiency of epoch 0."""
    sampler = TokenBatchSampler(src_lens, tgt_lens, max_tokens, seed=0, bucket_chunk=bucket_chunk,
                                mixture=mixture, segmentations=segmentations)
    batches = sampler.batches(0)
    return {
        "max_tokens": max_tokens,
        "batches_per_epoch": len(batches),
        "mean_pairs_per_batch": round(len(batches.rows) / len(batches), 1),
        "padding_efficiency": round(padding_efficiency(batches, src_lens, tgt_lens), 4),
    }
