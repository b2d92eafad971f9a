"""Training pairs changed on the fly as people type them (`data.augment`), batch by batch.

The prepared cache holds each pair's ids and its text. For a training batch (the rows the
sampler planned), `Augmenter.pieces` draws which pairs get which change (`perturb.py`:
upper case, title case, no final punctuation, typos in the source, two pairs merged),
re-encodes only those pairs' text with the run's SentencePiece model, and collates the
batch. It runs in the trainer's prefetch thread, off the training loop; dev and test sets
never pass through it.

Every draw is a function of (trainer.seed, epoch, row), hashed (`_uniform`): a resumed run
changes the pairs of a batch exactly as an unresumed one does, whatever thread or process
collates it. A changed pair is longer in tokens (an upper-cased line two or three times as long),
so two bounds hold:

- a changed pair longer than data.max_len tokens on a side (the bound preparation keeps
  every pair within) is trained on unchanged;
- a batch whose changed pairs take it past data.max_tokens padded tokens is cut into
  pieces of at most data.max_tokens each (its pairs sorted by length, cut where padding
  is least: `least_padding`), which the trainer runs as accumulated micro-batches of one
  update: every pair is trained on, and no forward pass holds more than the budget.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields

import numpy as np

from transformer.config import AugmentConfig
from transformer.data import perturb
from transformer.data.batching import (
    SRC_EXTRA,
    TGT_EXTRA,
    Batch,
    TokenIds,
    collate_flat,
)

# What a piece costs beside its tokens, in padded tokens per data.max_tokens: a forward and
# backward pass more. A 16th of the budget: on Tatoeba (max_tokens 4096) with upper, title,
# nopunct and typos at 0.1 and merge at 0.05, 5.3 pieces a batch holding 1.26x the clean
# batch's target tokens in 1.45x its padded tokens (1.96x when cut by the budget alone).
PIECE_COST = 1 / 16

# One stream of draws per change (and the typos' seed, the merge's partner): the hash's last key
_CHANGES = tuple(f.name for f in fields(AugmentConfig))
_TYPO_SEED, _PARTNER = len(_CHANGES), len(_CHANGES) + 1
_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: uint64 -> uint64, every bit of the input spread over the output."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return (x ^ (x >> np.uint64(31))) & _MASK


def _hash(seed: int, epoch: int, rows: np.ndarray, stream: int) -> np.ndarray:
    """A uint64 per row, a function of (seed, epoch, row, stream) alone."""
    with np.errstate(over="ignore"):
        key = _mix(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
        key = _mix(key ^ np.uint64(epoch & 0xFFFFFFFFFFFFFFFF))
        key = _mix(key ^ np.uint64(stream))
        return _mix(key ^ rows.astype(np.uint64))


def _uniform(seed: int, epoch: int, rows: np.ndarray, stream: int) -> np.ndarray:
    """A float in [0, 1) per row (53 bits of its hash)."""
    return (_hash(seed, epoch, rows, stream) >> np.uint64(11)).astype(np.float64) * 2.0**-53


@dataclass
class Drawn:
    """What one batch's pairs get: a bool per change and pair (by position in the batch),
    each pair's typo seed, and the position of the pair a merged one is joined with."""

    changes: dict[str, np.ndarray]  # change -> (B,) bool
    typo_seeds: np.ndarray  # (B,) uint64
    partners: np.ndarray  # (B,) int64: another position of the batch

    @property
    def any(self) -> np.ndarray:
        """(B,) bool: the pairs that get a change."""
        return np.logical_or.reduce(list(self.changes.values()))


def draw(cfg: AugmentConfig, seed: int, epoch: int, rows: np.ndarray) -> Drawn:
    """The changes the pairs `rows` (one batch, in order) get in `epoch`."""
    n = len(rows)
    changes = {name: _uniform(seed, epoch, rows, k) < getattr(cfg, name) for k, name in enumerate(_CHANGES)}
    changes["merge"] &= n > 1  # a batch of one pair has no other to join
    changes["title"] &= ~changes["upper"]
    step = 1 + (_hash(seed, epoch, rows, _PARTNER) % np.uint64(max(1, n - 1))).astype(np.int64)
    return Drawn(changes, _hash(seed, epoch, rows, _TYPO_SEED), (np.arange(n) + step) % max(1, n))


def changed_pair(drawn: Drawn, i: int, src: list[str], tgt: list[str]) -> tuple[str, str]:
    """Pair i of a batch with the changes drawn for it, in order: merged, final punctuation
    dropped, typos in the source, then cased (so that typos are cased too)."""
    pair = (src[i], tgt[i])
    has = {name: bool(mask[i]) for name, mask in drawn.changes.items()}
    if has["merge"]:
        j = drawn.partners[i]
        pair = perturb.merge(pair, (src[j], tgt[j]))
    if has["nopunct"]:
        pair = (perturb.nopunct(pair[0]), perturb.nopunct(pair[1]))
    if has["typos"]:
        pair = (perturb.typos(pair[0], int(drawn.typo_seeds[i])), pair[1])
    for case in ("upper", "title"):
        if has[case]:
            pair = (perturb.source(case, pair[0]), perturb.reference(case, pair[1]))
    return pair


class Augmenter:
    """Changes and collates training batches (`pieces`) for one run.

    Args:
        cfg: data.augment.
        seed: trainer.seed.
        train: the prepared training split (its `src` and `tgt` text columns are read,
            memory-mapped).
        tokenizer: the run's SentencePiece model, which encoded the cache.
        max_len, max_tokens: data.max_len and data.max_tokens (the bounds above).
        pad_to_multiple: the padding the batches get (as the sampler counts it).
        segmentations: K of data.subword_sampling (1: off): a batch's row `pair * K + j` is
            the pair's j-th sampled segmentation; its draws and text are the pair's, and a
            changed pair is encoded with the best segmentation.
    """

    def __init__(self, cfg: AugmentConfig, seed: int, train, tokenizer, max_len: int, max_tokens: int,
                 pad_to_multiple: int = 1, segmentations: int = 1) -> None:
        self.texts = tuple(Texts(train, side) for side in ("src", "tgt"))
        self.cfg, self.seed, self.tokenizer = cfg, seed, tokenizer
        self.max_len, self.max_tokens, self.pad_to = max_len, max_tokens, pad_to_multiple
        self.segmentations = segmentations

    def pieces(self, ids: TokenIds, rows: np.ndarray, epoch: int, vocab_size: int | None = None) -> list[Batch]:
        """Batch `rows` of `epoch` with its drawn changes, as one Batch, or several when the
        changed pairs outgrow data.max_tokens (each within it, every pair in one of them)."""
        tok, pair_of = self.tokenizer, rows // self.segmentations
        drawn = draw(self.cfg, self.seed, epoch, pair_of)
        changed = np.flatnonzero(drawn.any)
        if not len(changed):
            return [ids.collate_rows(rows, tok.pad_id, tok.bos_id, tok.eos_id, self.pad_to, vocab_size)]
        needed = np.union1d(changed, drawn.partners[changed[drawn.changes["merge"][changed]]])
        texts = [dict(zip(needed.tolist(), side.lines(pair_of[needed]), strict=True)) for side in self.texts]
        pairs = [changed_pair(drawn, int(i), *texts) for i in changed]
        # a line at a time: SentencePiece's call for a list costs more than a few dozen lines' encoding
        encoded = [[tok.encode_line(p[side]) for p in pairs] for side in (0, 1)]
        kept = [k for k in range(len(changed)) if max(len(encoded[0][k]), len(encoded[1][k])) <= self.max_len]
        at = changed[kept]  # changed pairs past data.max_len are trained on unchanged
        sides = [_replaced(*ids.take(rows, side), at, [encoded[side][k] for k in kept]) for side in (0, 1)]
        return self._cut(sides, vocab_size)

    def _cut(self, sides: list[tuple[np.ndarray, np.ndarray]], vocab_size: int | None) -> list[Batch]:
        """The batch's pairs (per side: flat ids, lengths) sorted by padded length and cut
        into batches of at most max_tokens padded tokens, where padding is least."""
        tok, m = self.tokenizer, self.pad_to
        lens = [side[1] for side in sides]
        src, tgt = (-(-(n + extra) // m) * m for n, extra in zip(lens, (SRC_EXTRA, TGT_EXTRA), strict=True))
        order = np.argsort(np.maximum(src, tgt), kind="stable")
        bounds = least_padding(src[order], tgt[order], self.max_tokens, int(self.max_tokens * PIECE_COST))
        return [collate_flat(*(_gather(*side, order[lo:hi]) for side in sides), tok.pad_id, tok.bos_id, tok.eos_id,
                             m, vocab_size) for lo, hi in itertools.pairwise(bounds)]


def cut_points(sizes: np.ndarray, max_tokens: int) -> np.ndarray:
    """Where a cut may fall in pairs sorted by size: where the size changes, and within a
    run of one size every `max_tokens // size` pairs (a run longer than the budget must be
    cut); with 0 and n. Cutting inside a run of one size saves no padding but what the
    budget forces, and there are far fewer runs than pairs."""
    n = len(sizes)
    starts = np.concatenate([[0], np.flatnonzero(np.diff(sizes)) + 1, [n]])
    points = [np.arange(a, b, max(1, max_tokens // int(sizes[a]))) for a, b in itertools.pairwise(starts)]
    return np.concatenate([*points, [n]]).astype(np.int64)


def least_padding(src: np.ndarray, tgt: np.ndarray, max_tokens: int, piece_cost: int) -> np.ndarray:
    """Where to cut pairs sorted by padded size (`src`, `tgt`: each pair's padded length a
    side, max(src, tgt) non-decreasing) into pieces of at most `max_tokens` (pairs x the
    longest pair's size), so that the padded tokens of both sides, plus `piece_cost` a
    piece, are least among the cuts at `cut_points`: the bounds (0, ..., n). Dynamic
    programming over those points, a numpy pass per point over the starts the budget allows."""
    sizes = np.maximum(src, tgt)
    points = cut_points(sizes, max_tokens)
    # the longest pair of each stretch between two points, a side
    longest = [np.maximum.reduceat(side, points[:-1]) for side in (src, tgt)]
    best, back = np.zeros(len(points)), np.zeros(len(points), dtype=np.int64)
    for k in range(1, len(points)):
        lo = int(np.searchsorted(points, points[k] - max_tokens // int(sizes[points[k] - 1])))  # within the budget
        over = [np.maximum.accumulate(side[lo:k][::-1])[::-1] for side in longest]  # from each start to k
        cost = best[lo:k] + (points[k] - points[lo:k]) * (over[0] + over[1]) + piece_cost
        back[k] = lo + int(np.argmin(cost))
        best[k] = cost[back[k] - lo]
    chosen = [len(points) - 1]
    while chosen[-1] > 0:
        chosen.append(int(back[chosen[-1]]))
    return points[chosen[::-1]]


class Texts:
    """One side's text column of a prepared split, read line by line where it lies
    (memory-mapped Arrow chunks): no copy of the column, and no Arrow compute call (a
    `take` on the chunked column costs milliseconds a batch)."""

    def __init__(self, train, side: str) -> None:
        column = train.with_format("arrow")[:].column(side)  # honours select()/shuffle() indices
        self.chunks = [c for c in column.chunks if len(c)]
        self.starts = np.cumsum([0, *(len(c) for c in self.chunks)])

    def lines(self, rows: np.ndarray) -> list[str]:
        chunk = np.searchsorted(self.starts, rows, side="right") - 1
        return [self.chunks[c][int(r - self.starts[c])].as_py() for c, r in zip(chunk, rows, strict=True)]


def _replaced(flat: np.ndarray, lens: np.ndarray, at: np.ndarray, new: list[list[int]]
              ) -> tuple[np.ndarray, np.ndarray]:
    """(flat ids, lengths) of a batch's rows with rows `at` (increasing) replaced by `new`."""
    if not len(at):
        return flat, lens
    starts = np.concatenate([[0], np.cumsum(lens)])
    parts, last = [], 0
    for i, ids in zip(at.tolist(), new, strict=True):
        parts += [flat[starts[last] : starts[i]], np.asarray(ids, dtype=flat.dtype)]
        last = i + 1
    parts.append(flat[starts[last] :])
    lens = lens.copy()
    lens[at] = [len(ids) for ids in new]
    return np.concatenate(parts), lens


def _gather(flat: np.ndarray, lens: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(flat ids, lengths) of `rows` of a (flat ids, lengths) batch, in that order."""
    starts = np.concatenate([[0], np.cumsum(lens)])
    out_lens = lens[rows]
    shift = np.repeat(starts[rows] - (np.cumsum(out_lens) - out_lens), out_lens)
    return flat[np.arange(int(out_lens.sum())) + shift], out_lens
