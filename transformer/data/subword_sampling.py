"""Subword sampling in training: several segmentations of each training sentence, one an epoch.

SentencePiece can cut a sentence into pieces in many ways; training on sampled ways
rather than the one best makes the model robust to how a word happens to be cut (Kudo
2018, "Subword regularization"; for a BPE model, BPE-dropout, Provilkov et al. 2020).
Sampling at every update would put SentencePiece on the training loop's host path, so
preparation does it instead: `data.subword_sampling.segmentations` (K) sampled
segmentations of each training source (and target, with `target: true`) are encoded by
the same worker processes as the best one and kept in the cache beside it
(`train/samples.arrow`, a `list<list<int32>>` column per sampled side, row-aligned with
`train/data.arrow`). Dev and test sets are never sampled.

Training sees K rows per pair, pair-major: row `pair * K + k` holds the pair's k-th
segmentation (`expanded_rows`), and an epoch draws its pairs as without sampling, each pair then
taking segmentation `(offset[pair] + epoch) % K`, the offset drawn once per seed: a pair
goes through all K before it sees one again (two of them may be the same cut of a short
sentence), and everything is a function of (seed, epoch), so a resumed run continues
exactly. The
batches are planned on the lengths of the rows an epoch actually takes, so a batch still
holds at most `data.max_tokens` padded tokens per side. A sampled segmentation longer than
`data.max_len` is replaced by the best one, so every training sequence stays within it.

The samples are drawn once, when the cache is made: runs on that cache, and their
resumes, see exactly the same segmentations; a cache made again holds other ones
(SentencePiece's generator is not reproducible from one process to the next).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transformer.config import SubwordSamplingConfig
from transformer.data.tokenizer import Tokenizer

SAMPLES = "samples.arrow"  # the sampled segmentations' file in the train folder of the cache
SIDES = ("src", "tgt")
SEGMENTATIONS = pa.list_(pa.list_(pa.int32()))
_OFFSET_SALT = 0x5EB  # keeps the offsets' generator apart from the epoch's shuffles


@dataclass(frozen=True)
class Sampling:
    """What preparation samples: `segmentations` per sentence of `sides` with SentencePiece's
    `alpha` and `nbest`, each at most `max_len` tokens (else the best one)."""

    alpha: float
    nbest: int
    segmentations: int
    sides: tuple[str, ...]
    max_len: int

    @classmethod
    def of(cls, cfg: SubwordSamplingConfig, max_len: int) -> Sampling | None:
        """The sampling `cfg` asks for; None when it is off."""
        if not cfg.on:
            return None
        return cls(cfg.alpha, cfg.nbest, cfg.segmentations, SIDES if cfg.target else SIDES[:1], max_len)

    def columns(self) -> list[str]:
        """The columns of `train/samples.arrow`: `src_samples`, and `tgt_samples` if sampled."""
        return [f"{side}_samples" for side in self.sides]


def sample_segmentations(tokenizer: Tokenizer, texts: list[str], best: list[list[int]], sampling: Sampling,
                         seed: list[int]) -> pa.Array:
    """`sampling.segmentations` sampled segmentations of each text (a `list<list<int32>>`
    array, one row a text), the k-th drawn with a seed made of `seed` and k; one longer
    than `sampling.max_len` is replaced by the text's best segmentation `best`."""
    per_k = [tokenizer.sample(texts, sampling.alpha, sampling.nbest,
                              int(np.random.SeedSequence([*seed, k]).generate_state(1)[0]))
             for k in range(sampling.segmentations)]
    rows = [[ids if len(ids) <= sampling.max_len else fallback for ids in samples]
            for fallback, *samples in zip(best, *per_k, strict=True)]
    return pa.array(rows, SEGMENTATIONS)


def offsets(seed: int, n_pairs: int, segmentations: int) -> np.ndarray:
    """Each pair's segmentation at epoch 0, drawn once per seed."""
    return np.random.default_rng([seed, _OFFSET_SALT]).integers(segmentations, size=n_pairs)


def expanded_rows(pairs: np.ndarray, epoch: int, seed: int, n_pairs: int, segmentations: int) -> np.ndarray:
    """The rows (`pair * K + k`) that `pairs` (of `n_pairs`) take at `epoch`: segmentation
    `(offset + epoch) % K` of each, K = `segmentations`."""
    k = (offsets(seed, n_pairs, segmentations)[pairs] + epoch) % segmentations
    return pairs * segmentations + k


def expanded_lengths(samples: pa.Table, column: str) -> np.ndarray:
    """The token count of every segmentation in `column`, pair-major (row `pair * K + k`)."""
    flat = pc.list_flatten(samples.column(column))
    return pc.list_value_length(flat).to_numpy(zero_copy_only=False).astype(np.int64)
