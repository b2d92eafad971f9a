"""Training on several corpora at once, each with a weight (`data=europarl_tatoeba`).

A weight is the share of an epoch's training pairs drawn from that corpus, as in
OpenNMT-py's corpus weights: with Tatoeba (313k short pairs) and Europarl (636k long
ones) at 1:1, half of the pairs come from each, so Tatoeba is upsampled about 1.5x and
Europarl is seen at about 0.75 of its size per epoch. The tokenizer is trained on a
sample balanced the same way (`mix_sample`).

An epoch has as many pairs as the corpora together, or `data.epoch_pairs` (fairseq's
--virtual-epoch-size: the CPU recipes see less than one real epoch). The weights may
change with the epoch: `data.phases` give the first epochs their own weights (a
Tatoeba-first phase: `[{epochs: 2, corpora: {tatoeba: 1}}]`, Europarl drawing nothing),
and `data.corpora` hold from the end of the last phase on.

Within a corpus, pairs are drawn from a seeded permutation that is consumed across
epochs: every pair is used once before any is used twice, whether the corpus is up- or
downsampled, and a phase that draws nothing from it leaves its place in the stream.
Everything is a function of (seed, epoch), so every DDP rank draws the same epoch and a
resumed run continues mid-epoch exactly (the trainer saves the epoch and the batch
position).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import numpy as np


def epoch_counts(sizes: list[int], weights: list[float], total: int | None = None) -> list[int]:
    """Pairs each corpus contributes to an epoch of `total` pairs (default: sum of sizes),
    proportional to the weights, rounded by largest remainder so they sum to `total`."""
    total = sum(sizes) if total is None else total
    w = np.asarray(weights, dtype=np.float64)
    exact = total * w / w.sum()
    counts = np.floor(exact).astype(np.int64)
    for i in np.argsort(-(exact - counts), kind="stable")[: total - int(counts.sum())]:
        counts[i] += 1
    return counts.tolist()


class CorpusMixture:
    """Which rows an epoch draws from each corpus of a weighted mix.

    `sizes` are the corpora's pair counts, in the order their rows are concatenated in
    the training dataset; `weights` their shares of an epoch's pairs. `phases` are
    (epochs, weights) of the first epochs, in order (a weight may be 0 there; a phase of
    0 epochs is skipped); `weights` hold after them. `epoch_pairs`: pairs an epoch draws
    (default: the sum of `sizes`).
    """

    def __init__(self, sizes: list[int], weights: list[float], seed: int,
                 phases: Sequence[tuple[int, Sequence[float]]] = (),
                 epoch_pairs: int | None = None) -> None:
        if len(sizes) != len(weights) or not sizes or min(sizes) < 1 or min(weights) <= 0:
            raise ValueError(f"need one positive weight per non-empty corpus: sizes {sizes}, "
                             f"weights {weights}")
        for epochs, phase in phases:
            if len(phase) != len(sizes) or min(phase) < 0 or sum(phase) <= 0 or epochs < 0:
                raise ValueError(f"a phase needs 0 or more epochs and one weight >= 0 per "
                                 f"corpus, not all 0: {epochs} epochs, weights {list(phase)}")
        if epoch_pairs is not None and epoch_pairs < 1:
            raise ValueError(f"an epoch needs at least one pair, not {epoch_pairs}")
        self.sizes, self.weights, self.seed = list(sizes), list(weights), seed
        self.offsets = np.cumsum([0, *sizes[:-1]])
        self.total = sum(self.sizes) if epoch_pairs is None else epoch_pairs
        # (first epoch, end epoch, pairs per corpus) of each phase, then of `weights`, endless
        self.schedule: list[tuple[int, float, np.ndarray]] = []
        first = 0
        for epochs, phase in phases:
            if epochs > 0:
                counts = np.asarray(epoch_counts(self.sizes, list(phase), self.total))
                self.schedule.append((first, first + epochs, counts))
                first += epochs
        self.schedule.append((first, math.inf, np.asarray(epoch_counts(self.sizes, self.weights, self.total))))

    def __len__(self) -> int:
        return self.total

    def reseeded(self, seed: int) -> CorpusMixture:
        """The same mix drawn with another seed."""
        other = copy.copy(self)
        other.seed = seed
        return other

    def counts(self, epoch: int) -> list[int]:
        """Pairs each corpus contributes to `epoch` (its phase's weights)."""
        return next(c for _, end, c in self.schedule if epoch < end).tolist()

    def stream_start(self, epoch: int) -> list[int]:
        """Pairs each corpus gave to the epochs before `epoch`: where in its stream of
        permutations `epoch` starts drawing."""
        start = np.zeros(len(self.sizes), dtype=np.int64)
        for first, end, counts in self.schedule:
            start += max(0, min(epoch, end) - first) * counts
        return start.tolist()

    def _draw(self, corpus: int, start: int, count: int) -> np.ndarray:
        """Positions [start, start + count) of corpus `corpus`'s endless stream of
        permutations (a fresh permutation per pass over the corpus)."""
        n = self.sizes[corpus]
        positions = np.arange(start, start + count, dtype=np.int64)
        passes = positions // n
        out = np.empty(count, dtype=np.int64)
        for p in np.unique(passes):
            perm = np.random.default_rng([self.seed, corpus, int(p)]).permutation(n)
            sel = passes == p
            out[sel] = perm[positions[sel] % n]
        return out

    def epoch_indices(self, epoch: int) -> np.ndarray:
        """The epoch's rows of the concatenated dataset, shuffled."""
        starts, counts = self.stream_start(epoch), self.counts(epoch)
        parts = [self.offsets[c] + self._draw(c, starts[c], counts[c]) for c in range(len(self.sizes))]
        rows = np.concatenate(parts)
        return rows[np.random.default_rng([self.seed, epoch, len(self.sizes)]).permutation(len(rows))]

    def corpus_of(self, rows: np.ndarray) -> np.ndarray:
        """The corpus index of each row of the concatenated dataset."""
        return np.searchsorted(self.offsets, rows, side="right") - 1


def mix_sample(corpora: list, weights: list[float], n_sentences: int, seed: int = 0) -> list[str]:
    """About `n_sentences` sentences (both sides of n_sentences / 2 pairs) drawn from the
    corpora (`clean_split.CleanSplit`s, or `corpus.Pairs`) in proportion to the weights: the
    text a mix's joint vocabulary is trained on, so that each corpus shapes it as much as it shapes training.
    A corpus asked for more pairs than it has gives all of them, repeated."""
    out: list[str] = []
    counts = epoch_counts([len(p) for p in corpora], weights, total=max(1, n_sentences // 2))
    for c, (pairs, count) in enumerate(zip(corpora, counts, strict=True)):
        n = len(pairs)
        rows = np.concatenate([np.random.default_rng([seed, c, k]).permutation(n)
                               for k in range(-(-count // n))])[:count]
        rows = np.sort(rows)
        for s, t in zip(pairs.take(rows, "src"), pairs.take(rows, "tgt"), strict=True):
            out.append(s)
            out.append(t)
    return out
