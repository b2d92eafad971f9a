"""Finished hypotheses kept on the device until their batch is done (fairseq's and
CTranslate2's bookkeeping), so that a decoder step never waits to hand them to Python.

Shapes: B sentences of the batch, K hypotheses kept per sentence, L the longest output
(tokens, without BOS and EOS), A live sentences, C candidates per live sentence, R rows
of the search's token history.

Each sentence owns K + 1 slots of a flat buffer: K for its hypotheses, in the order they
finished, and one sink. `add` writes every candidate of a step at once, the rejected ones
(not finished, or past the sentence's K-th, or of a sentence already done) into their
sentence's sink, so the writes need no host read to know which rows they are.
`hypotheses` reads the buffers back in one transfer when the batch is done and
normalises the scores on the host, in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class Hypothesis:
    tokens: list[int]  # output ids, without BOS and EOS
    score: float  # length-normalised sum of log-probabilities (EOS included)


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty ((5 + |y|) / 6) ** alpha; |y| counts the EOS."""
    return ((5 + length) / 6) ** alpha


class Finished:
    """Up to K finished hypotheses of each of B sentences: tokens, raw scores, lengths.

    Args:
        n: B, the sentences of the batch.
        k: K, the hypotheses kept per sentence (the beam size; 1 for greedy search).
        max_tokens: L, the longest hypothesis any sentence of the batch may write.
        pad_id: what fills the token buffer past each hypothesis' end.
        device: where the buffers live (the search's device).
    """

    def __init__(self, n: int, k: int, max_tokens: int, pad_id: int, device: torch.device) -> None:
        self.n, self.k, self.max_tokens = n, k, max_tokens
        slots = n * (k + 1)  # slot k of each sentence is its sink
        self.tokens = torch.full((slots, max_tokens), pad_id, dtype=torch.long, device=device)
        self.scores = torch.full((slots,), math.nan, device=device)  # raw sums; NaN: slot unused
        self.lengths = torch.zeros(slots, dtype=torch.long, device=device)
        self.count = torch.zeros(n, dtype=torch.long, device=device)  # (B,) slots filled
        self.closed = torch.zeros(n, dtype=torch.bool, device=device)  # (B,) accepts no more

    def add(self, sent: torch.Tensor, ends: torch.Tensor, scores: torch.Tensor,
            rows: torch.Tensor, history: torch.Tensor) -> None:
        """File the candidates that end here, in candidate order, while there is room.

        sent (A,): the batch index of each live sentence; ends (A, C) bool: the candidates
        that end (EOS); scores (A, C): their raw scores (log-probabilities summed, EOS
        included); rows (A, C): the row of `history` (R, t+1) each extends, whose tokens
        after BOS become the hypothesis (t tokens).
        """
        k, t = self.k, history.size(1) - 1
        slot = self.count[sent][:, None] + ends.long().cumsum(dim=1) - 1  # (A, C)
        accept = ends & (slot < k) & ~self.closed[sent][:, None]
        where = (sent[:, None] * (k + 1) + torch.where(accept, slot, k)).flatten()  # (A*C,)
        self.scores[where] = scores.flatten().float()
        self.lengths[where] = t
        if t:
            self.tokens[where, :t] = history.index_select(0, rows.flatten())[:, 1:]
        self.count[sent] += accept.sum(dim=1)

    def close(self, sent: torch.Tensor, also: torch.Tensor | None = None) -> torch.Tensor:
        """Mark done the sentences `sent` (A,) that hold K hypotheses, or where `also`
        (A,) is True; returns which of them are done (A,) bool, on the device."""
        done = self.count[sent] >= self.k
        if also is not None:
            done |= also
        done |= self.closed[sent]
        self.closed[sent] = done
        return done

    def hypotheses(self, lenpen: float) -> list[list[Hypothesis]]:
        """Each sentence's hypotheses, best first, the batch read back in one transfer.

        Scores are divided by the GNMT length penalty on the host in float64, and sorted
        stably: equal scores keep the order in which they finished.
        """
        k = self.k
        packed = torch.cat([self.tokens.double(), self.lengths.double()[:, None],
                            self.scores.double()[:, None]], dim=1)  # (B*(K+1), L+2)
        rows = packed.tolist()  # the batch's one read-back
        out: list[list[Hypothesis]] = []
        for b in range(self.n):
            hyps = []
            for row in rows[b * (k + 1): b * (k + 1) + k]:
                raw = row[-1]
                if math.isnan(raw):
                    continue
                length = int(row[-2])
                hyps.append(Hypothesis([int(x) for x in row[:length]],
                                       raw / length_penalty(length + 1, lenpen)))
            hyps.sort(key=lambda h: h.score, reverse=True)
            out.append(hyps)
        return out
