"""Finished hypotheses and the tokens of every row, kept on the device until their batch
is done, so that a decoder step never waits to hand them to Python.

Shapes: B sentences of the batch, K candidates that may end per sentence and step, L + 1
steps (L the longest output, without BOS and EOS), A live sentences, R rows (hypotheses)
of a step, R_max the most rows a step has.

A step writes a fixed amount, whatever its number: the token each row of the next step
took and the row of this step it extends (a back-pointer, as in CTranslate2's and
fairseq's beam history), and the raw score of each candidate that ends here (NaN where
none does) with the row it extends. No history is copied while decoding: `hypotheses`
reads the batch's buffers back in one transfer when it is done, and follows the
back-pointers on the host. A sentence's hypotheses are its first K ending candidates, in
step and candidate order, up to its maximum length (fairseq's rule: a sentence is done
once K have finished, or at its maximum length): what its rows find after that, decoding
on until the search drops them, is not filed. Scores are normalised on the host, in
float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Hypothesis:
    tokens: list[int]  # output ids, without BOS and EOS
    score: float  # length-normalised sum of log-probabilities (EOS included)


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty ((5 + |y|) / 6) ** alpha; |y| counts the EOS."""
    return ((5 + length) / 6) ** alpha


class Finished:
    """What a batch's search found: ending candidates per step and the rows' tokens.

    Args:
        n: B, the sentences of the batch.
        k: K, the candidates per sentence that may end at a step (the beam size; 1 for
            greedy search), and the hypotheses kept per sentence.
        steps: L + 1, the steps the search may run.
        rows: R_max, the most rows a step has.
        device: where the buffers live (the search's device).
        max_len: (B,) the most tokens each sentence's hypotheses may have; None: steps - 1.
    """

    def __init__(self, n: int, k: int, steps: int, rows: int, device: torch.device,
                 max_len: torch.Tensor | None = None) -> None:
        self.n, self.k = n, k
        # (B,) each sentence's longest hypothesis: what ends later (its rows decoding on
        # after it was done) is not filed
        self.max_len = torch.full((n,), steps - 1, device=device) if max_len is None else max_len
        self.scores = torch.full((steps, n, k), math.nan, device=device)  # raw sums; NaN: none
        self.rows = torch.zeros((steps, n, k), dtype=torch.long, device=device)
        self.tokens = torch.zeros((steps, rows), dtype=torch.long, device=device)
        # each row extends its own number unless `follow` says otherwise (greedy search)
        self.parents = torch.arange(rows, device=device).repeat(steps, 1)

    def add(self, step: int, sent: torch.Tensor, scores: torch.Tensor, rows: torch.Tensor) -> None:
        """The candidates of step `step` of the live sentences `sent` (A,): scores (A, K)
        the raw score (log-probabilities summed, EOS included) of each that ends here, NaN
        or -inf where none does; rows (A, K) the row of this step each extends."""
        self.scores[step].index_copy_(0, sent, scores)
        self.rows[step].index_copy_(0, sent, rows)

    def follow(self, step: int, parents: torch.Tensor | None, tokens: torch.Tensor) -> None:
        """Row i of step `step` + 1 is row parents[i] (R',) of this step (None: row i)
        plus tokens[i]."""
        if parents is not None:
            self.parents[step, :parents.numel()] = parents
        self.tokens[step, :tokens.numel()] = tokens

    def hypotheses(self, lenpen: float) -> list[list[Hypothesis]]:
        """Each sentence's hypotheses (at most K), best first, the batch read back in one
        transfer.

        Scores are divided by the GNMT length penalty on the host in float64, and sorted
        stably: equal scores keep the order in which they finished.
        """
        steps, n, k = self.scores.shape
        packed = torch.cat([self.scores.double().flatten(), self.rows.double().flatten(),
                            self.tokens.double().flatten(), self.parents.double().flatten(),
                            self.max_len.double()])
        flat = packed.cpu().numpy()  # the batch's one read-back
        cells = steps * n * k
        scores = flat[:cells].reshape(steps, n, k)
        rows = flat[cells:2 * cells].reshape(steps, n, k).astype(np.int64)
        max_len = flat[-n:].astype(np.int64)
        tokens, parents = (a.reshape(steps, -1).astype(np.int64)
                           for a in np.split(flat[2 * cells:-n], 2))
        out: list[list[Hypothesis]] = []
        for b in range(n):
            hyps = []
            for t, j in zip(*np.nonzero(np.isfinite(scores[:max_len[b] + 1, b])), strict=True):
                if len(hyps) == k:
                    break
                hyps.append(Hypothesis(_backtrack(tokens, parents, int(t), int(rows[t, b, j])),
                                       float(scores[t, b, j]) / length_penalty(int(t) + 1, lenpen)))
            hyps.sort(key=lambda h: h.score, reverse=True)
            out.append(hyps)
        return out


def _backtrack(tokens: np.ndarray, parents: np.ndarray, step: int, row: int) -> list[int]:
    """The tokens of row `row` of step `step`: the `step` tokens it took after BOS."""
    out = []
    for t in range(step - 1, -1, -1):
        out.append(int(tokens[t, row]))
        row = int(parents[t, row])
    return out[::-1]
