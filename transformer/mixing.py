"""Training on several corpora at once, each with a weight (`data=europarl_tatoeba`).

A weight is the share of an epoch's training pairs drawn from that corpus, as in
OpenNMT-py's corpus weights: with Tatoeba (313k short pairs) and Europarl (636k long
ones) at 1:1, half of the pairs come from each, so Tatoeba is upsampled about 1.5x and
Europarl is seen at about 0.75 of its size per epoch. The tokenizer is trained on a
sample balanced the same way (`data.mix_sample`).

An epoch has as many pairs as the corpora together. Within a corpus, pairs are drawn
from a seeded permutation that is consumed across epochs: every pair is used once before
any is used twice, whether the corpus is up- or downsampled. Everything is a function of
(seed, epoch), so every DDP rank draws the same epoch and a resumed run continues
mid-epoch exactly (the trainer saves the epoch and the batch position).
"""

from __future__ import annotations

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
    the training dataset; `weights` their shares of an epoch's pairs.
    """

    def __init__(self, sizes: list[int], weights: list[float], seed: int) -> None:
        if len(sizes) != len(weights) or not sizes or min(sizes) < 1 or min(weights) <= 0:
            raise ValueError(f"need one positive weight per non-empty corpus: sizes {sizes}, "
                             f"weights {weights}")
        self.sizes, self.weights, self.seed = list(sizes), list(weights), seed
        self.offsets = np.cumsum([0, *sizes[:-1]])
        self.counts = epoch_counts(self.sizes, self.weights)

    def __len__(self) -> int:
        return sum(self.counts)

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
        parts = [self.offsets[c] + self._draw(c, epoch * count, count)
                 for c, count in enumerate(self.counts)]
        rows = np.concatenate(parts)
        return rows[np.random.default_rng([self.seed, epoch, len(self.sizes)]).permutation(len(rows))]

    def corpus_of(self, rows: np.ndarray) -> np.ndarray:
        """The corpus index of each row of the concatenated dataset."""
        return np.searchsorted(self.offsets, rows, side="right") - 1


def mix_sample(corpora: list, weights: list[float], n_sentences: int, seed: int = 0) -> list[str]:
    """About `n_sentences` sentences (both sides of n_sentences / 2 pairs) drawn from the
    corpora (`corpus.Pairs`) in proportion to the weights: the text a mix's joint
    vocabulary is trained on, so that each corpus shapes it as much as it shapes training.
    A corpus asked for more pairs than it has gives all of them, repeated."""
    out: list[str] = []
    counts = epoch_counts([len(p) for p in corpora], weights, total=max(1, n_sentences // 2))
    for c, (pairs, count) in enumerate(zip(corpora, counts, strict=True)):
        n = len(pairs)
        rows = np.concatenate([np.random.default_rng([seed, c, k]).permutation(n)
                               for k in range(-(-count // n))])[:count]
        for i in np.sort(rows).tolist():
            out.append(pairs.src[i])
            out.append(pairs.tgt[i])
    return out
