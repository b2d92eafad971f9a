"""Sampling decoding (`decode.method=sample`): the next token drawn from the model's
distribution, truncated and tempered as CTranslate2's options of the same names say.

Shapes: R rows (one per live sentence), B sentences, V vocabulary, K kept candidates.

The search is greedy search's (`search.greedy_search`, its cached or compiled step, its
length limits, forced EOS and constraints); only the choice of the token differs. Of the
step's log-probabilities (forbidden tokens already at -inf):
- `sampling_topp` < 1 keeps the most probable tokens whose probabilities (renormalised
  over the allowed tokens) first reach topp, the token that crosses it included;
- `sampling_topk` > 0 keeps the k most probable of those (0: no limit; 1: greedy);
- `sampling_temperature` T: the kept tokens are drawn with probability softmax(logp / T).
The kept set is a prefix of the tokens sorted by probability, whichever rule cuts it,
so the two truncations commute; temperature is applied last, as CTranslate2 does.
Top-p alone sorts the whole vocabulary at every step, which costs on a CPU many times
the rest of the draw; with a top-k as well only the k best are sorted (`topk`).
A sampled hypothesis scores what a greedy one does: the model's log-probabilities of
its tokens (neither truncated nor tempered), length-normalised.

Draws are counter-based, so that a sentence's translation does not depend on the batch it
is decoded in: each sentence has a 32-bit key, a hash of `decode.seed` and its place in
the input (its line, and its number among the line's sentences: `sentence_key`), and its
uniform number at step t is a hash of (key, t) made on the device (`_uniform`). The token
is then found by inverting the kept tokens' cumulative distribution (one `searchsorted`
per step): no read of the device by the host, no generator state, nothing that depends
on which other sentences share the batch. What changes with the batch is only the rounding
of the model's probabilities (as for greedy search's near-ties), and the device too.
"""

from __future__ import annotations

import torch

__all__ = ["Sampler", "sentence_key", "unit_keys"]

_MASK = 0xFFFFFFFF  # hashes are 32-bit values held in int64 tensors (no unsigned overflow)
_M1, _M2 = 0x7FEB352D, 0x846CA68B  # Chris Wellons's "lowbias32" integer hash


def _mix(x: int) -> int:
    """lowbias32 of a Python int (its low 32 bits): the host's half of the hash."""
    x &= _MASK
    x ^= x >> 16
    x = (x * _M1) & _MASK
    x ^= x >> 15
    x = (x * _M2) & _MASK
    return x ^ (x >> 16)


def _mul32(x: torch.Tensor, m: int) -> torch.Tensor:
    """(x * m) mod 2**32 for x (int64, values below 2**32), in two 16-bit halves of m so
    that no product leaves int64 (x * m itself could reach 2**64)."""
    return (x * (m & 0xFFFF) + (((x * (m >> 16)) & 0xFFFF) << 16)) & _MASK


def _mix_tensor(x: torch.Tensor) -> torch.Tensor:
    """`_mix` of every element of x (int64, values below 2**32), on x's device."""
    x = x ^ (x >> 16)
    x = _mul32(x, _M1)
    x = x ^ (x >> 15)
    x = _mul32(x, _M2)
    return x ^ (x >> 16)


def sentence_key(seed: int, line: int, index: int) -> int:
    """A sentence's 32-bit key: decode.seed, its line (0-based, in the whole input) and its
    number among that line's sentences and pieces, hashed."""
    key = _mix(seed) ^ (seed >> 32)
    for part in (line & _MASK, line >> 32, index):
        key = _mix(key ^ _mix(part + 0x9E3779B9))
    return key


def unit_keys(seed: int, owner: list[int], first_line: int = 1) -> list[int]:
    """The `sentence_key` of each decoded unit (a sentence, or a piece of a long one):
    owner[u] its line's index among the lines given, first_line the number of the first
    of them in the whole input (`stream.py` translates a file a window at a time)."""
    keys, count, last = [], 0, None
    for line in owner:
        count = count + 1 if line == last else 0
        last = line
        keys.append(sentence_key(seed, first_line - 1 + line, count))
    return keys


def _uniform(keys: torch.Tensor, step: int) -> torch.Tensor:
    """(R,) float32 in (0, 1]: the draw of each row's sentence (keys (R,)) at `step`, with
    24 random bits (float32's mantissa: every value exact)."""
    h = _mix_tensor(keys ^ _mix(step ^ 0x85EBCA6B))
    return ((h >> 8) + 1).to(torch.float32) * (1.0 / (1 << 24))


class Sampler:
    """Draws each row's next token (`__call__`); settings checked by `DecodeConfig.validate`.

    keys: (B,) int64, each sentence's `sentence_key`, on the search's device.
    """

    def __init__(self, keys: torch.Tensor, topk: int = 0, topp: float = 1.0,
                 temperature: float = 1.0) -> None:
        self.keys, self.topk, self.topp, self.temperature = keys, topk, topp, temperature

    @classmethod
    def build(cls, cfg, keys: list[int] | None, n: int, device: torch.device) -> Sampler:
        """The sampler of `cfg` (a DecodeConfig) for a batch of n sentences; keys: their
        `sentence_key`s, or None: keys from cfg.seed and their places in this batch (the
        draws then depend on the batch)."""
        if keys is None:
            keys = [sentence_key(cfg.seed, i, 0) for i in range(n)]
        return cls(torch.tensor(keys, dtype=torch.int64, device=device), cfg.sampling_topk,
                   cfg.sampling_topp, cfg.sampling_temperature)

    def __call__(self, logp: torch.Tensor, rows: torch.Tensor, step: int) -> torch.Tensor:
        """logp (R, V) log-probabilities (forbidden tokens -inf); rows (R,) the sentence of
        each row (its index in the batch) -> (R,) the drawn tokens."""
        kept, ids = self.candidates(logp)  # (R, K) log-probabilities, (R, K) ids or None
        if self.temperature != 1.0:  # the best at 0 first: no temperature overflows it to -inf
            kept = (kept - kept.amax(dim=-1, keepdim=True)) / self.temperature
        weights = torch.softmax(kept, dim=-1)
        cdf = weights.cumsum(dim=-1)  # (R, K)
        u = _uniform(self.keys.index_select(0, rows), step)  # (R,) in (0, 1]
        # the first candidate whose cumulative weight reaches u * total: one of weight > 0
        # (a zero-weight one before it has a smaller cdf, and u > 0), never past the last
        pick = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).clamp_(max=cdf.size(1) - 1)
        return pick.squeeze(1) if ids is None else ids.gather(1, pick).squeeze(1)

    def candidates(self, logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The kept tokens of each row: (log-probabilities (R, K), their ids (R, K)), the
        others at -inf; ids None: every token, in vocabulary order (K = V)."""
        if self.topk == 0 and self.topp >= 1.0:
            return logp, None
        if self.topk:
            kept, ids = logp.topk(min(self.topk, logp.size(-1)), dim=-1)  # sorted, best first
        else:
            kept, ids = logp.sort(dim=-1, descending=True)
        if self.topp < 1.0:  # the probability mass before each candidate, over the allowed tokens
            p = (kept - torch.logsumexp(logp, dim=-1, keepdim=True)).exp()
            before = p.cumsum(dim=-1) - p
            kept = kept.masked_fill(before >= self.topp, -torch.inf)  # the first always stays
        return kept, ids
