"""Batched greedy and beam search on the model's incremental decoding cache.

Shapes: B batch (sentences), S source length, K beam size, A live sentences, W beams per
live sentence (1 at the first step, then K), R = A*W rows, V vocabulary.

The source is encoded once; each step feeds the decoder one new token per row and reads
the log-probabilities of the next one. Rows of finished sentences are dropped from the
batch (and from the cache), so a long sentence does not make the short ones pay for it.

The host reads the device at most once a step (`sync_every`): how many sentences are
still live; and once per batch before the steps (the shortest length limit) and after
them (the hypotheses). Everything else stays on the device (fairseq's and CTranslate2's way):
finished hypotheses, their scores and lengths go into `finished.Finished`'s buffers, the
rows to keep are found by a stable sort of the done flags, and the batch's hypotheses are
read back in one transfer when it is done (docs/decoding.md, "On the device").

Conventions shared by both searches (fairseq's, with the GNMT length penalty):
- A `Hypothesis` holds the output tokens without BOS and EOS. Its score is the sum of
  the log-probabilities of its tokens and of the final EOS, divided by the length
  penalty lp(|y|) = ((5 + |y|) / 6) ** lenpen (Wu et al. 2016, eq. 14), where |y| counts
  the tokens plus the EOS. lenpen = 0 gives the plain sum of log-probabilities.
- Maximum length: a * |x| + b output tokens, |x| the non-padding source ids (what
  `batching.collate` puts there: the source tokens, without BOS or EOS), capped by the
  model's positional table. A hypothesis that reaches it is closed with a forced EOS (which is scored).
- Minimum length: EOS is forbidden until a hypothesis has `min_len` tokens.
- Padding and BOS are never chosen (fairseq and JoeyNMT forbid them too); their
  probability still counts in the normalisation, as the model gave it.

Beam search stopping rule (fairseq's): at each step the 2K best continuations of a
sentence are ranked; EOS candidates among the first K become finished hypotheses, and
the first K non-EOS candidates are the live beams of the next step. A sentence is done
once it holds K finished hypotheses, or when its beams reach the maximum length. With
lenpen > 0 a live beam could in theory still overtake the K-th finished hypothesis;
like fairseq we accept that in exchange for not running every sentence to max length.

The search talks to the model only through `encode`, `decode` with a `DecoderCache`,
and `model.cfg` (bos/eos/pad ids, max_positions), so a scripted fake model can stand in.
"""

from __future__ import annotations

import math

import torch

from transformer.config import DecodeConfig
from transformer.decoding.constraints import Constraints
from transformer.decoding.finished import Finished, Hypothesis, length_penalty
from transformer.model.transformer import DecoderCache

__all__ = ["Hypothesis", "beam_search", "best_continuations", "greedy_search", "length_penalty",
           "logsumexp", "max_lengths", "search"]

# Steps between the host's reads of how many sentences are live, per device type. On a CPU
# every step: dropping finished rows at once is what pays there. On a GPU a read stops the
# host until the device has caught up; reading every few steps lets it queue the next
# steps' kernels meanwhile, at the price of done rows decoding a few steps longer.
# The CUDA value is a first guess, to be measured (scripts/gpu/gpu_check.py, decode step).
SYNC_EVERY = {"cpu": 1, "cuda": 4}

# exp() of arguments below about -87 gives denormal or zero floats, which x86 CPUs compute
# on a slow path: once a model is confident most of its (N, V) log-probabilities are that
# small, and a loss built on torch.logsumexp slows down as the model learns (docs/performance.md,
# "Earlier measurements"). exp(-60) ~ 1e-26 is zero for these purposes; clamping there keeps
# every exp in normal floats. The loss (training/loss.py) runs on PyTorch's vectorised
# log_softmax/softmax instead, which do not fall that far: on a confident model's logits
# they take about as long as on an untrained model's (docs/results.md, "Figures behind the
# code's choices").
_MIN_EXP = -60.0


def _shifted_exp(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """exp(x - shift[:, None]) (N, V) as a new tensor, arguments clamped at _MIN_EXP."""
    return torch.sub(x, shift[:, None]).clamp_(min=_MIN_EXP).exp_()


def logsumexp(x: torch.Tensor) -> torch.Tensor:
    """log(sum(exp(x))) over the last dimension of x (N, V) -> (N,), without exp's slow path."""
    top = x.amax(dim=-1)
    return top + _shifted_exp(x, top).sum(dim=-1).log()


def max_lengths(model, src_ids: torch.Tensor, a: float, b: int, min_len: int) -> torch.Tensor:
    """Per-sentence maximum output length (B,), a * |x| + b, within the model's limits."""
    src_len = (src_ids != model.cfg.pad_id).sum(dim=1)
    limit = model.cfg.max_positions - 1  # BOS and the tokens fill positions 0..max_positions - 1
    if min_len > limit:  # EOS would be both forbidden and forced: nothing could be scored
        raise ValueError(f"min_len={min_len} exceeds the longest output this model writes "
                         f"({limit} tokens, max_positions={model.cfg.max_positions} minus BOS)")
    max_len = torch.floor(a * src_len.double() + b).long().clamp(max=limit)
    return max_len.clamp(min=min(min_len, limit))


def longest_output(model, src_ids: torch.Tensor, a: float, b: int, min_len: int) -> int:
    """An upper bound on `max_lengths` (B,) known without reading the device: the padded
    width S stands for every |x|. The search runs at most this many steps plus one."""
    limit = model.cfg.max_positions - 1
    longest = src_ids.size(1) if a >= 0 else 0
    return max(min(math.floor(a * longest + b), limit), min(min_len, limit))


class _Stepper:
    """Feeds one token per row, returns next-token logits, and follows row choices.

    use_cache=False re-runs the decoder over the whole prefix at every step (what
    `torch.nn.Transformer` users do); it is the reference for tests and benchmarks.
    """

    def __init__(self, model, src_ids: torch.Tensor, use_cache: bool = True) -> None:
        self.model = model
        self.src_ids = src_ids  # (R, S)
        self.memory = model.encode(src_ids)  # (R, S, D)
        self.cache = DecoderCache() if use_cache else None
        bos = model.cfg.bos_id
        self.tgt_ids = torch.full((src_ids.size(0), 1), bos, device=src_ids.device)  # (R, t+1)

    def select(self, index: torch.Tensor, same_sources: bool = False) -> None:
        """Keep rows `index` (R',), in that order: beam selection and finished rows.

        same_sources: every row moves to a row of the same sentence (so the same source,
        memory and cross-attention cache), which then need no copying.
        """
        if not same_sources:
            self.src_ids = self.src_ids.index_select(0, index)
            self.memory = self.memory.index_select(0, index)
        self.tgt_ids = self.tgt_ids.index_select(0, index)
        if self.cache is not None and len(self.cache):
            self.cache.reorder(index, cross=not same_sources)

    def logits(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Next-token logits (R, V) and their logsumexp (R,), float32.

        log p = logits - logsumexp; callers add the two only where they need to, which
        saves a pass over (R, V) compared with log_softmax.
        """
        if self.cache is None:
            logits = self.model.decode(self.tgt_ids, self.memory, self.src_ids)
        else:
            new = self.tgt_ids if not len(self.cache) else self.tgt_ids[:, -1:]
            logits = self.model.decode(new, self.memory, self.src_ids, self.cache)
        logits = logits[:, -1].float()
        return logits, logsumexp(logits)  # clamped exp: fast on a confident model's logits

    def append(self, tokens: torch.Tensor) -> None:
        self.tgt_ids = torch.cat([self.tgt_ids, tokens[:, None]], dim=1)


def _forbid(logits: torch.Tensor, step: int, min_len: int, cfg,
            constraints: Constraints | None = None, history: torch.Tensor | None = None,
            alive: torch.Tensor | None = None, w: int = 1) -> torch.Tensor:
    """Forbid padding and BOS always, and EOS before min_len: in place on logits (R, V)
    whose logsumexp is already taken. Three columns: no pass over (R, V). Then the
    batch's `constraints` (a forced prefix, no repeated n-grams; None: nothing more),
    given the rows' history (R, t+1) and the sentence (A,) of each run of w rows."""
    logits[:, cfg.pad_id] = -math.inf
    logits[:, cfg.bos_id] = -math.inf
    if step < min_len:
        logits[:, cfg.eos_id] = -math.inf
    if constraints is not None:
        constraints(logits, history, alive.repeat_interleave(w) if w > 1 else alive, step)
    return logits


def _live_rows(done: torch.Tensor, step: int, sync_every: int) -> torch.Tensor | None:
    """The rows to keep after a step, (A',) in order; None: keep them all; an empty
    tensor: every sentence is done. done (A,) bool, on the device.

    The step's one host read, every `sync_every` steps: how many are live. The rows
    themselves come from a stable sort of the done flags (live first, in order), which
    needs no read, unlike `nonzero`.
    """
    if (step + 1) % sync_every:
        return None
    live = int((~done).sum())
    if live == done.numel():
        return None
    return torch.sort(done.to(torch.uint8), stable=True).indices[:live]


@torch.inference_mode()
def greedy_search(
    model,
    src_ids: torch.Tensor,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    min_len: int = 1,
    lenpen: float = 0.0,
    use_cache: bool = True,
    sync_every: int = 1,
    constraints: Constraints | None = None,
) -> list[Hypothesis]:
    """src_ids (B, S) -> the most probable next token at every step, one per sentence.

    Args:
        model (Transformer): the model (eval mode), or anything with `encode`, `decode`
            with a `DecoderCache`, and `cfg` (a scripted fake in the tests).
        src_ids: source ids (B, S), right-padded, no BOS or EOS.
        max_len_a: a of the length limit a * |x| + b (|x| the non-padding source ids).
        max_len_b: b of the length limit.
        min_len: EOS is forbidden before this many tokens.
        lenpen: GNMT length-penalty alpha the score is divided by; 0: the plain sum.
        use_cache: decode incrementally on the key/value cache; False recomputes every
            position at each step (the tests compare the two).
        sync_every: steps between the host's reads of how many sentences are live (and
            drops of the finished rows); the result does not depend on it.
        constraints: the batch's forced prefixes and n-gram rule (`constraints.py`), or None.

    Returns:
        One `Hypothesis` per sentence, in input order: its tokens (no BOS or EOS) and its
        score (the log-probabilities of the tokens and EOS, length-normalised).

    Raises:
        ValueError: a min_len the model's positional table cannot hold.
    """
    cfg, n, device = model.cfg, src_ids.size(0), src_ids.device
    max_len = max_lengths(model, src_ids, max_len_a, max_len_b, min_len)  # (B,)
    if not n:
        return []
    bound = longest_output(model, src_ids, max_len_a, max_len_b, min_len)
    first_max = int(max_len.min())  # the batch's one read before its steps
    finished = Finished(n, 1, bound, cfg.pad_id, device)
    stepper = _Stepper(model, src_ids, use_cache)
    alive = torch.arange(n, device=device)  # (A,) batch index of each row
    scores = torch.zeros(n, dtype=torch.float32, device=device)  # (A,)
    for step in range(bound + 1):  # by step `bound` every sentence is at its max length
        logits, lse = stepper.logits()  # (A, V), (A,)
        best, tokens = _forbid(logits, step, min_len, cfg, constraints, stepper.tgt_ids,
                               alive).max(dim=-1)
        if step >= first_max:  # forced EOS where max_len is reached, scored as the model gave it
            at_max = step >= max_len[alive]
            best = torch.where(at_max, logits[:, cfg.eos_id], best)
            tokens = tokens.masked_fill(at_max, cfg.eos_id)
        scores += best - lse
        rows = torch.arange(alive.numel(), device=device)[:, None]
        finished.add(alive, (tokens == cfg.eos_id)[:, None], scores[:, None], rows, stepper.tgt_ids)
        done = finished.close(alive)
        stepper.append(tokens)
        if step == bound:
            break
        keep = _live_rows(done, step, sync_every)
        if keep is not None:
            if not keep.numel():
                break
            stepper.select(keep)
            alive, scores = alive[keep], scores[keep]
    return [hyps[0] for hyps in finished.hypotheses(lenpen)]


@torch.inference_mode()
def beam_search(
    model,
    src_ids: torch.Tensor,
    beam_size: int = 5,
    lenpen: float = 0.6,
    nbest: int = 1,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    min_len: int = 1,
    use_cache: bool = True,
    sync_every: int = 1,
    constraints: Constraints | None = None,
) -> list[list[Hypothesis]]:
    """src_ids (B, S) -> for each sentence its `nbest` best hypotheses, best first.

    Args:
        model (Transformer): the model (eval mode), or anything with `encode`, `decode`
            with a `DecoderCache`, and `cfg` (a scripted fake in the tests).
        src_ids: source ids (B, S), right-padded, no BOS or EOS.
        beam_size: K, the beams kept per sentence; a sentence is done once K hypotheses
            have finished (fairseq's rule, see the module docstring).
        lenpen: GNMT length-penalty alpha that orders finished hypotheses; 0: the plain
            sum of log-probabilities.
        nbest: how many hypotheses to return per sentence, 1 <= nbest <= beam_size.
        max_len_a: a of the length limit a * |x| + b (|x| the non-padding source ids).
        max_len_b: b of the length limit.
        min_len: EOS is forbidden before this many tokens.
        use_cache: decode incrementally on the key/value cache; False recomputes every
            position at each step (the tests compare the two).
        sync_every: steps between the host's reads of how many sentences are live (and
            drops of the finished rows); the result does not depend on it.
        constraints: the batch's forced prefixes and n-gram rule (`constraints.py`), or None.

    Returns:
        For each sentence, in input order, up to `nbest` `Hypothesis`es, best
        (highest length-normalised score) first.

    Raises:
        ValueError: nbest outside [1, beam_size], or a min_len the model's positional
            table cannot hold.
    """
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"need 1 <= nbest <= beam_size, got nbest={nbest}, beam_size={beam_size}")
    cfg, k, n, device = model.cfg, beam_size, src_ids.size(0), src_ids.device
    max_len = max_lengths(model, src_ids, max_len_a, max_len_b, min_len)  # (B,)
    if not n:
        return []
    bound = longest_output(model, src_ids, max_len_a, max_len_b, min_len)
    first_max = int(max_len.min())  # the batch's one read before its steps
    finished = Finished(n, k, bound, cfg.pad_id, device)
    stepper = _Stepper(model, src_ids, use_cache)
    alive = torch.arange(n, device=device)  # batch index of each live sentence (A,)
    # One row per sentence at the first step (all its beams would be the same BOS): the
    # first selection then fans each sentence out to K rows, cache included.
    scores = torch.zeros(n, 1, device=device)  # (A, W): W beams per sentence, 1 then K
    for step in range(bound + 1):  # by step `bound` every sentence is at its max length
        a, w = scores.size()
        logits, lse = stepper.logits()  # (A*W, V), (A*W,)
        at_max = forced = None
        if step >= first_max:  # (A,): these sentences end here with a forced EOS
            at_max = step >= max_len[alive]
            forced = (at_max[:, None].expand(a, w).reshape(-1), cfg.eos_id)
        top_scores, top_beam, top_tok = best_continuations(
            _forbid(logits, step, min_len, cfg, constraints, stepper.tgt_ids, alive, w),
            scores.view(-1) - lse, w, 2 * k, forced)
        # EOS candidates among the first K finish; the first K others are the live beams.
        is_eos = top_tok == cfg.eos_id  # (A, 2K)
        ends = is_eos[:, :k] & top_scores[:, :k].isfinite()
        first_rows = torch.arange(a, device=device)[:, None] * w
        finished.add(alive, ends, top_scores[:, :k], first_rows + top_beam[:, :k], stepper.tgt_ids)
        rank = torch.arange(top_tok.size(1), device=device) + is_eos * top_tok.size(1)
        pick = rank.topk(min(k, rank.size(1)), dim=-1, largest=False).indices  # (A, K)
        scores = top_scores.gather(1, pick)
        beams, tokens = top_beam.gather(1, pick), top_tok.gather(1, pick)
        done = finished.close(alive, also=at_max)  # (A,)
        if step == bound:
            break
        keep = _live_rows(done, step, sync_every)
        if keep is not None and not keep.numel():
            break
        if keep is not None:
            beams, tokens, scores, alive = beams[keep], tokens[keep], scores[keep], alive[keep]
            first_rows = first_rows[keep]
        # Beams move only within their sentence unless a sentence ended or fans out (step 1).
        stepper.select((first_rows + beams).flatten(), same_sources=w == k and keep is None)
        stepper.append(tokens.flatten())
    return [hyps[:nbest] or [Hypothesis([], -math.inf)] for hyps in finished.hypotheses(lenpen)]


def best_continuations(
    logits: torch.Tensor, offset: torch.Tensor, w: int, n: int,
    forced_eos: tuple[torch.Tensor, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The n best (row, token) continuations of each sentence, best first.

    logits (A*W, V) of W rows per sentence; a continuation scores logits[r, v] + offset[r]
    (offset: the row's score so far minus its logsumexp). Returns (scores, beam, token),
    each (A, min(n, W*V)); beam in [0, W). forced_eos: (rows (A*W,) bool, eos id): those
    rows continue with EOS only, at its own score (a hypothesis at its maximum length).

    A sentence's n best continuations are among each row's n best tokens, since a row's
    offset shifts all its tokens alike: so rank the (A, W*n) row winners, not (A, W*V).
    """
    c = min(n, logits.size(-1))
    row_top, row_tok = logits.topk(c, dim=-1)  # (A*W, C)
    if forced_eos is not None:  # on the (A*W, C) winners: no pass over (A*W, V)
        forced, eos = forced_eos
        only_eos = torch.full_like(row_top, -math.inf)
        only_eos[:, 0] = logits[:, eos]
        row_top = torch.where(forced[:, None], only_eos, row_top)
        row_tok = row_tok.masked_fill(forced[:, None], eos)
    cand = (row_top + offset[:, None]).view(-1, w * c)  # (A, W*C)
    top_scores, top_idx = cand.topk(min(n, w * c), dim=-1)  # (A, n), best first
    return top_scores, top_idx // c, row_tok.view(-1, w * c).gather(1, top_idx)


def search(model, src_ids: torch.Tensor, cfg: DecodeConfig,
           prefixes: list[list[int] | None] | None = None) -> list[list[Hypothesis]]:
    """Decode src_ids (B, S) as `cfg` says; n-best lists (a list of one for greedy).

    Args:
        model (Transformer): the model (eval mode), or anything `greedy_search` and
            `beam_search` take.
        src_ids: source ids (B, S), right-padded, no BOS or EOS.
        cfg: the search: method (greedy or beam), beam_size, lenpen, nbest, max_len_a,
            max_len_b, min_len, no_repeat_ngram_size (its other fields are
            `text.translate_nbest`'s).
        prefixes: None, or per sentence the ids its output must start with (or None);
            each no longer than the sentence's length limit (`text.first_unit_prefixes`).

    Returns:
        For each sentence, in input order, its n-best list of `Hypothesis`es, best first:
        one hypothesis for greedy search, up to cfg.nbest for beam search.

    Raises:
        ValueError: an unknown cfg.method, or settings the searches refuse.

    The host reads the device every `SYNC_EVERY[device type]` steps (1 on a CPU).
    """
    sync_every = SYNC_EVERY.get(src_ids.device.type, 1)
    constraints = Constraints.build(prefixes, cfg.no_repeat_ngram_size, src_ids.device)
    if cfg.method == "greedy":
        hyps = greedy_search(model, src_ids, cfg.max_len_a, cfg.max_len_b, cfg.min_len,
                             cfg.lenpen, sync_every=sync_every, constraints=constraints)
        return [[h] for h in hyps]
    if cfg.method == "beam":
        return beam_search(model, src_ids, cfg.beam_size, cfg.lenpen, cfg.nbest,
                           cfg.max_len_a, cfg.max_len_b, cfg.min_len, sync_every=sync_every,
                           constraints=constraints)
    raise ValueError(f"unknown decode.method {cfg.method!r}: expected greedy or beam")
