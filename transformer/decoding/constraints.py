"""Constraints on a search step: a forced target prefix and no repeated n-grams.

Shapes: R rows of the step (hypotheses), V vocabulary, t the tokens written so far (the
step), B sentences of the batch, P the longest prefix.

    constraints = Constraints.build(prefixes, no_repeat_ngram_size=3, device=device)
    steps = ConstrainedSteps(constraints, rows, bound, bos_id, device)   # search.py, per batch
    steps(logp, sent, step)                 # in place, once a step
    steps.advance(index, tokens, step)      # the rows the search kept, and their tokens

Both act on a step's log-probabilities, as the search's own rule for padding, BOS and an
early EOS does: a token they rule out gets -inf, and a token they let
through keeps the log-probability the model gave it (logit - logsumexp). So a forced
prefix token is scored as the model scores it, and `Translator.score` of the output
gives the search's score.

- A prefix (`target_prefix`: ids per sentence, or none) forces sentence b's first
  len(prefix[b]) tokens: at step t < len(prefix[b]) every other token of its rows is
  ruled out, EOS included.
- `no_repeat_ngram_size` n (0: off; fairseq's, HF's and CTranslate2's option): a row
  never writes a token that would repeat an n-gram of its own output (BOS not counted),
  except inside its forced prefix, which is written as given: the prefix wins.

Nothing here reads the device: the step number and the prefix lengths' maximum are host
integers known before the steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from transformer.bounds import MAX_NO_REPEAT_NGRAM


@dataclass
class Constraints:
    """A batch's constraints (`build`); calling it applies them to one step's logits."""

    prefix: torch.Tensor | None = None  # (B, P) prefix ids, padded with -1
    prefix_len: int = 0  # P, the longest prefix: steps beyond it are free
    no_repeat_ngram_size: int = 0

    @classmethod
    def build(cls, prefixes: Sequence[Sequence[int] | None] | None, no_repeat_ngram_size: int,
              device: torch.device | str) -> Constraints | None:
        """The constraints of a batch: `prefixes` one per sentence (None or [] for none);
        None when there are none, so that a search without them dispatches nothing more."""
        if no_repeat_ngram_size < 0 or no_repeat_ngram_size > MAX_NO_REPEAT_NGRAM:
            raise ValueError(f"no_repeat_ngram_size={no_repeat_ngram_size}: need 0 <= n <= "
                             f"{MAX_NO_REPEAT_NGRAM}")
        longest = max((len(p) for p in prefixes or [] if p), default=0)
        prefix = None
        if longest:
            rows = [list(p or []) + [-1] * (longest - len(p or [])) for p in prefixes]
            prefix = torch.tensor(rows, dtype=torch.long).to(device)  # (B, P)
        if prefix is None and not no_repeat_ngram_size:
            return None
        return cls(prefix, longest, no_repeat_ngram_size)

    def __call__(self, logits: torch.Tensor, history: torch.Tensor, sent: torch.Tensor,
                 step: int) -> torch.Tensor:
        """Apply the constraints in place to logits (R, V) of step `step` (t tokens written).

        history (R, >= t + 1): BOS and the tokens each row wrote (a preallocated buffer
        may be wider: columns past t are ignored); sent (R,): the sentence of each row
        (an index into the prefixes).
        """
        wanted = self.prefix[sent, step] if self.prefix is not None and step < self.prefix_len else None
        if self.no_repeat_ngram_size:  # not on a row still in its prefix, which may repeat
            ban_repeats(logits, history[:, 1:step + 1], self.no_repeat_ngram_size,
                        None if wanted is None else wanted < 0)
        if wanted is not None:
            force_prefix(logits, wanted)
        return logits


class ConstrainedSteps:
    """A batch's `Constraints` applied to each step of its search (`search.py`). The
    n-gram rule needs each row's own tokens, which the search keeps only as back-pointers
    (`finished.Finished`): so, with that rule on alone, a (R, bound + 2) history of BOS and
    the tokens written, reordered with the rows (`advance`)."""

    def __init__(self, constraints: Constraints, rows: int, bound: int, bos: int,
                 device: torch.device) -> None:
        self.constraints = constraints
        self.history = (torch.full((rows, bound + 2), bos, device=device)
                        if constraints.no_repeat_ngram_size else None)  # (R, bound + 2)

    def __call__(self, logp: torch.Tensor, sent: torch.Tensor, step: int) -> torch.Tensor:
        """logp (R, V) in place; sent (R,): each row's sentence in the batch."""
        return self.constraints(logp, self.history, sent, step)

    def advance(self, index: torch.Tensor | None, tokens: torch.Tensor, step: int) -> None:
        """Row i of the next step is row index[i] (None: row i) plus tokens[i] (R',)."""
        if self.history is None:
            return
        if index is not None:
            self.history = self.history.index_select(0, index)
        self.history[:, step + 1] = tokens


def force_prefix(logits: torch.Tensor, wanted: torch.Tensor) -> torch.Tensor:
    """Rows whose `wanted` (R,) id is >= 0 keep only that token's logit (R, V), in place."""
    vocab = torch.arange(logits.size(1), device=logits.device)
    other = (wanted[:, None] >= 0) & (vocab[None] != wanted[:, None])  # (R, V)
    return logits.masked_fill_(other, -math.inf)


def ban_repeats(logits: torch.Tensor, written: torch.Tensor, n: int,
                rows: torch.Tensor | None = None) -> torch.Tensor:
    """Rule out, in place on logits (R, V), each token that would close an n-gram that
    `written` (R, t) already holds (its last n - 1 tokens followed by it); only on `rows`
    (R,) bool, if given."""
    t = written.size(1)
    if n == 1:  # every token written is a 1-gram
        match = torch.ones_like(written, dtype=torch.bool)
        return _ban(logits, written, match if rows is None else match & rows[:, None])
    if t < n:  # no complete n-gram written yet
        return logits
    grams = written.unfold(1, n, 1)  # (R, t - n + 1, n): every n-gram written
    tail = written[:, t - n + 1:]  # (R, n - 1): what the next token would extend
    match = (grams[:, :, :-1] == tail[:, None]).all(dim=-1)  # (R, t - n + 1)
    return _ban(logits, grams[:, :, -1], match if rows is None else match & rows[:, None])


def _ban(logits: torch.Tensor, tokens: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """logits[r, tokens[r, j]] = -inf wherever where[r, j] (tokens, where: (R, J))."""
    hits = torch.zeros_like(logits).scatter_add_(1, tokens, where.to(logits.dtype))  # (R, V)
    return logits.masked_fill_(hits > 0, -math.inf)
