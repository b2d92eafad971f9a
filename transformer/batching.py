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

from transformer.mixing import CorpusMixture

# Tokens collate adds to each side: nothing to the source, BOS (tgt_in) or EOS (tgt_out)
# to the target. Batch sizes are computed on these padded lengths.
SRC_EXTRA = 0
TGT_EXTRA = 1


@dataclass
class Batch:
    src_ids: torch.Tensor  # (B, S) long, right-padded
    tgt_in_ids: torch.Tensor  # (B, T) long: BOS + y, right-padded
    tgt_out_ids: torch.Tensor  # (B, T) long: y + EOS, right-padded
    pad_id: int = 0

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        move = lambda x: x.to(device, non_blocking=non_blocking)  # noqa: E731
        return Batch(move(self.src_ids), move(self.tgt_in_ids), move(self.tgt_out_ids), self.pad_id)

    def pin_memory(self) -> Batch:
        """Called by DataLoader(pin_memory=True)."""
        pin = lambda x: x.pin_memory()  # noqa: E731
        return Batch(pin(self.src_ids), pin(self.tgt_in_ids), pin(self.tgt_out_ids), self.pad_id)

    def __len__(self) -> int:
        return self.src_ids.size(0)

    @property
    def n_src_tokens(self) -> int:
        """Real (non-padding) source tokens."""
        return int((self.src_ids != self.pad_id).sum())

    @property
    def n_tgt_tokens(self) -> int:
        """Real target tokens predicted by the loss (y + EOS)."""
        return int((self.tgt_out_ids != self.pad_id).sum())


def collate(
    examples: Sequence[Mapping[str, Sequence[int]]] | Mapping[str, Sequence[Sequence[int]]],
    pad_id: int,
    bos_id: int,
    eos_id: int,
) -> Batch:
    """Pad a list of `{"src_ids", "tgt_ids"}` examples (or one dict of such lists) to a Batch."""
    if isinstance(examples, Mapping):  # dataset[indices] gives columns
        srcs, tgts = examples["src_ids"], examples["tgt_ids"]
    else:
        srcs = [ex["src_ids"] for ex in examples]
        tgts = [ex["tgt_ids"] for ex in examples]
    src_ids, _ = _pad(srcs, pad_id, offset=0, extra=SRC_EXTRA)
    tgt_in_ids, tgt_lens = _pad(tgts, pad_id, offset=1, extra=TGT_EXTRA)
    tgt_in_ids[:, 0] = bos_id
    tgt_out_ids, _ = _pad(tgts, pad_id, offset=0, extra=TGT_EXTRA)
    tgt_out_ids[torch.arange(len(tgts)), tgt_lens] = eos_id
    return Batch(src_ids, tgt_in_ids, tgt_out_ids, pad_id)


def _pad(
    seqs: Sequence[Sequence[int]], pad_id: int, offset: int, extra: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, max_len + extra) long tensor with row i's ids at [offset, offset + len_i); lengths.

    Vectorised in numpy (one boolean-mask assignment): a Python loop over rows, or the same
    in torch with its thread pool, takes 10-20 ms for a batch of 400 short sentences.
    """
    lens = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=int(lens.sum()))
    out = np.full((len(seqs), int(lens.max()) + extra), pad_id, dtype=np.int64)
    positions = np.arange(out.shape[1])
    inside = (positions >= offset) & (positions < lens[:, None] + offset)  # row-major = flat order
    out[inside] = flat
    return torch.from_numpy(out), torch.from_numpy(lens)


def pad(seqs: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    """Right-pad non-empty id lists to a (B, S) long tensor, as `collate` pads a source."""
    return _pad(seqs, pad_id, offset=0, extra=0)[0]


def length_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices grouped, longest first, so that rows * longest length <= max_tokens (decoding).

    A sentence longer than max_tokens gets a batch of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= max_tokens:
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


class TokenBatchSampler:
    """Batches of example indices with at most `max_tokens` padded tokens per side.

    Each epoch: shuffle the indices (seeded by seed and epoch), sort chunks of about
    `bucket_chunk` batches' worth of examples by length, cut them greedily into batches,
    then shuffle the batches. With `world_size > 1` every rank computes the same global
    list and takes every `world_size`-th batch; the list is first made a multiple of
    `world_size` by halving the largest batches, so no pair is dropped and all ranks get
    the same number of batches (DDP would hang otherwise).

    `src_lens`/`tgt_lens` are token counts without BOS/EOS (see `token_lengths`).
    With a `mixture` (several corpora, weighted), an epoch is the mixture's draw of rows
    instead of a permutation of all of them. Usable as a DataLoader `batch_sampler` after
    `set_epoch(epoch, start)`.
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
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world_size {world_size}")
        src = np.asarray(src_lens, dtype=np.int64) + SRC_EXTRA
        tgt = np.asarray(tgt_lens, dtype=np.int64) + TGT_EXTRA
        if len(src) != len(tgt) or len(src) == 0:
            raise ValueError(
                f"need as many source as target lengths, got {len(src)} and {len(tgt)}"
            )
        self.sizes = np.maximum(src, tgt)  # padded tokens one example costs per row
        longest = int(self.sizes.argmax())
        if self.sizes[longest] > max_tokens:
            raise ValueError(
                f"example {longest} has {self.sizes[longest]} tokens (with BOS/EOS), more than "
                f"max_tokens={max_tokens}: raise max_tokens or lower data.max_len"
            )
        if mixture is not None and sum(mixture.sizes) != len(src):
            raise ValueError(f"the mixture covers {sum(mixture.sizes)} rows, the data has {len(src)}")
        self.mixture = mixture
        self.src, self.tgt = src, tgt
        self.max_tokens = max_tokens
        self.seed, self.shuffle = seed, shuffle
        self.rank, self.world_size = rank, world_size
        mean_batch = max(1, int(max_tokens // self.sizes.mean()))
        self.chunk_size = max(1, bucket_chunk * mean_batch)  # examples sorted together
        self.epoch, self.start = 0, 0
        self._cache: tuple[int, list[list[int]]] | None = None

    def global_batches(self, epoch: int) -> list[list[int]]:
        """All ranks' batches for `epoch`, in training order; rank r takes [r::world_size]."""
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        rng = np.random.default_rng([self.seed, epoch])
        if self.mixture is not None:
            order = self.mixture.epoch_indices(epoch)
        else:
            order = rng.permutation(len(self.sizes)) if self.shuffle else np.arange(len(self.sizes))
        batches: list[list[int]] = []
        for lo in range(0, len(order), self.chunk_size):
            chunk = order[lo : lo + self.chunk_size]
            # sort by padded size, then by source length, so neighbours pad each other least
            chunk = chunk[np.lexsort((self.src[chunk], self.sizes[chunk]))]
            batches.extend(self._cut(chunk))
        batches = _split_to_multiple(batches, self.world_size)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        self._cache = (epoch, batches)
        return batches

    def _cut(self, chunk: np.ndarray) -> list[list[int]]:
        """Greedy cut of a length-sorted chunk into batches within max_tokens."""
        batches, current, longest = [], [], 0
        for i, size in zip(chunk.tolist(), self.sizes[chunk].tolist()):
            if current and (len(current) + 1) * max(longest, size) > self.max_tokens:
                batches.append(current)
                current, longest = [], 0
            current.append(i)
            longest = max(longest, size)
        if current:
            batches.append(current)
        return batches

    def batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches for `epoch`; deterministic for (seed, epoch)."""
        return self.global_batches(epoch)[self.rank :: self.world_size]

    def iter_from(self, epoch: int, start: int = 0) -> Iterator[list[int]]:
        """Resume `epoch` at this rank's batch `start` (the number of batches already done)."""
        yield from self.batches(epoch)[start:]

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def __iter__(self) -> Iterator[list[int]]:
        return self.iter_from(self.epoch, self.start)

    def __len__(self) -> int:
        return len(self.batches(self.epoch)) - self.start


def _split_to_multiple(batches: list[list[int]], world_size: int) -> list[list[int]]:
    """Halve the largest batches until their number is a multiple of world_size."""
    batches = list(batches)
    while len(batches) % world_size:
        largest = max(range(len(batches)), key=lambda i: len(batches[i]))
        b = batches[largest]
        if len(b) < 2:  # only single-example batches left: nothing to split
            raise ValueError(
                f"cannot share {len(batches)} single-example batches among {world_size} ranks"
            )
        half = len(b) // 2
        batches[largest : largest + 1] = [b[:half], b[half:]]
    return batches


def padding_efficiency(
    batches: Sequence[Sequence[int]], src_lens: Sequence[int], tgt_lens: Sequence[int]
) -> float:
    """Real tokens / padded tokens over both sides of `batches` (1.0 = no padding).

    Lengths are without BOS/EOS, as given to TokenBatchSampler; collate's extras count.
    """
    src = np.asarray(src_lens, dtype=np.int64) + SRC_EXTRA
    tgt = np.asarray(tgt_lens, dtype=np.int64) + TGT_EXTRA
    real = padded = 0
    for b in batches:
        s, t = src[b], tgt[b]
        real += int(s.sum() + t.sum())
        padded += len(b) * int(s.max() + t.max())
    return real / padded if padded else 1.0


def batching_statistics(
    src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, bucket_chunk: int,
    mixture: CorpusMixture | None = None,
) -> dict:
    """Batches per epoch, pairs per batch and padding efficiency of epoch 0."""
    sampler = TokenBatchSampler(src_lens, tgt_lens, max_tokens, seed=0, bucket_chunk=bucket_chunk,
                                mixture=mixture)
    batches = sampler.batches(0)
    return {
        "max_tokens": max_tokens,
        "batches_per_epoch": len(batches),
        "mean_pairs_per_batch": round(sum(map(len, batches)) / len(batches), 1),
        "padding_efficiency": round(padding_efficiency(batches, src_lens, tgt_lens), 4),
    }
