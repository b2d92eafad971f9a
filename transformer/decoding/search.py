"""Batched greedy and beam search on the model's incremental decoding cache (and sampling,
greedy search's loop with each token drawn: `sampling.py`).

Shapes: B batch (sentences), S source length, K beam size, A live sentences, W beams per
live sentence (1 at the first step, then K), R = A*W rows, V vocabulary.

The source is encoded once; each step feeds the decoder one new token per row, on a cache
preallocated for the batch (`model/cache.py`), and reads the log-probabilities of the
next one. Rows of finished sentences are dropped from the batch (and from the cache), so
a long sentence does not make the short ones pay for it.

The host reads the device at most once a step (`sync_every`): how many sentences are
still live; and once per batch before the steps (the shortest length limit) and after
them (the hypotheses). Everything else stays on the device: the history (each row's token
and the row it extends) and the finished candidates' scores go into `finished.Finished`'s
buffers, the rows to keep are found by a stable sort of the done flags, and the batch's
hypotheses are read back in one transfer when it is done (docs/search.md, "On the
device"). fairseq and CTranslate2 read more, each of them once a step (fairseq's
finalized candidates, CTranslate2's top-k); what a step writes and allocates here follows
them instead (docs/search.md, "A step of fixed shape").

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
and `model.cfg` (bos/eos/pad ids, max_positions), so a scripted fake model can stand in;
a compiled step (`decode.compile`) runs `static_step` as well (`decoder_state.py`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from transformer.config import DecodeConfig
from transformer.decoding.constraints import ConstrainedSteps, Constraints
from transformer.decoding.decoder_state import DecoderState
from transformer.decoding.finished import Finished, Hypothesis, length_penalty
from transformer.decoding.sampling import Sampler

__all__ = ["Hypothesis", "beam_search", "best_continuations", "greedy_search", "length_penalty",
           "logsumexp", "max_lengths", "search"]

# The search's defaults per device type (`decode.sync_every`, `decode.buckets`):
# Steps between the host's reads of how many sentences are live. On a CPU every step:
# dropping finished rows at once is what pays there. On a GPU a read stops the host until
# the device has caught up; reading every few steps lets it queue the next steps' kernels
# meanwhile, at the price of done rows decoding a few steps longer.
SYNC_EVERY = {"cpu": 1, "cuda": 4}

# Device types whose finished rows leave in powers of two (`_live_rows`) where the step is
# compiled: a compiled or graphed step has one graph per shape, so a batch should have
# few. An eager step gains nothing from them: there every finished row leaves at once.
BUCKETS = {"cuda"}

# exp() of arguments below about -87 gives denormal or zero floats, which x86 CPUs compute
# on a slow path: once a model is confident most of its (N, V) log-probabilities are that
# small, and a loss built on torch.logsumexp slows down as the model learns (docs/results/training-speed.md,
# "Why the step is built so"). exp(-60) ~ 1e-26 is zero for these purposes; clamping there keeps
# every exp in normal floats (`logsumexp`, which the forced scoring pass of
# `decoding/tokens.py` takes). The search's step takes PyTorch's vectorised log_softmax, as
# the loss (training/loss.py) does, which does not fall that far (docs/results/code-figures.md, "Figures
# behind the code's choices").
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


def _forbidden(cfg, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The ids never chosen (padding and BOS: fairseq and JoeyNMT forbid them too), and
    those forbidden before min_len (EOS as well), for one `index_fill_` a step: three
    columns, no pass over (R, V). Their probability still counts in the normalisation."""
    always = torch.tensor([cfg.pad_id, cfg.bos_id], device=device)
    return always, torch.cat([always, torch.tensor([cfg.eos_id], device=device)])


def _live_rows(open_: torch.Tensor, step: int, sync_every: int, buckets: bool) -> torch.Tensor | None:
    """The rows to keep after a step, (A',) in order; None: keep them all; an empty
    tensor: every sentence is done. open_ (A,) bool, on the device: not done.

    The step's one host read, every `sync_every` steps: how many are live. The rows
    themselves come from a stable sort of the done flags (live first, in order), which
    needs no read, unlike `nonzero`. buckets: keep the live rows padded with done ones to
    a power of two, so that a batch sees a handful of shapes (a compiled or graphed step
    one per shape); what the done rows find is not filed (`finished.Finished`).
    """
    if (step + 1) % sync_every:
        return None
    live, rows = int(open_.sum()), open_.numel()
    if buckets:  # a power of two
        keep = 1 << max(live - 1, 0).bit_length() if live else 0
    else:  # once an eighth is done: fewer ops per row dropped, and little work on done rows
        keep = live if live <= rows - max(rows // 8, 1) else rows
    if keep >= rows:
        return None
    return torch.sort(open_, descending=True, stable=True).indices[:keep]


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
    buckets: bool = False,
    constraints: Constraints | None = None,
    compile: str | None = None,
    sampler: Sampler | None = None,
) -> list[Hypothesis]:
    """src_ids (B, S) -> the most probable next token at every step (or one drawn by
    `sampler`), one hypothesis per sentence.

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
        buckets: finished rows leave in powers of two (`_live_rows`); the result does
            not depend on it.
        constraints: the batch's forced prefixes and n-gram rule (`constraints.py`), or None.
        compile: a `torch.compile` mode for the cached step (`decoder_state.py`), or None:
            eager. The result does not depend on it beyond rounding.
        sampler: draws each token instead of taking the most probable (`sampling.py`,
            decode.method=sample), from the same log-probabilities; None: greedy.

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
    earliest_limit = int(max_len.min())  # the batch's one read before its steps
    finished = Finished(n, 1, bound + 1, n, device, max_len)
    decoder = DecoderState(model, src_ids, bound, n, use_cache, compile)
    always, early = _forbidden(cfg, device)
    alive = torch.arange(n, device=device)  # (A,) batch index of each row
    rows = alive  # (A,) each row extends itself
    scores = torch.zeros(n, dtype=torch.float32, device=device)  # (A,)
    open_ = torch.ones(n, dtype=torch.bool, device=device)  # (A,) not ended yet
    rule = None if constraints is None else ConstrainedSteps(constraints, n, bound, cfg.bos_id, device)
    for step in range(bound + 1):  # by step `bound` every sentence is at its max length
        logp = decoder.log_probs().index_fill_(1, early if step < min_len else always, -math.inf)
        if rule is not None:
            rule(logp, alive, step)
        if sampler is None:
            best, tokens = logp.max(dim=-1)  # (A,)
        else:  # scored as the model gives it: neither truncated nor tempered
            tokens = sampler(logp, alive, step)
            best = logp.gather(1, tokens[:, None]).squeeze(1)
        if step >= earliest_limit:  # forced EOS where max_len is reached, scored as the model gave it
            at_max = step >= max_len
            best = torch.where(at_max, logp[:, cfg.eos_id], best)
            tokens = tokens.masked_fill(at_max, cfg.eos_id)
        scores += best
        is_eos = tokens == cfg.eos_id
        # an EOS after the sentence's first is not filed: `Finished` keeps its first K
        finished.add(step, alive, torch.where(is_eos, scores, math.nan)[:, None], rows[:, None])
        open_ = open_ > is_eos  # and not EOS
        if step == bound:
            break
        keep = _live_rows(open_, step, sync_every, buckets)
        if keep is None:
            finished.follow(step, None, tokens)  # each row extends itself
            decoder.advance(None, tokens)
            if rule is not None:
                rule.advance(None, tokens, step)
            continue
        if not keep.numel():
            break
        tokens = tokens[keep]
        finished.follow(step, keep, tokens)
        decoder.advance(keep, tokens, sentences=keep)
        if rule is not None:
            rule.advance(keep, tokens, step)
        alive, scores, open_, max_len = alive[keep], scores[keep], open_[keep], max_len[keep]
        rows = torch.arange(keep.numel(), device=device)
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
    buckets: bool = False,
    constraints: Constraints | None = None,
    compile: str | None = None,
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
        buckets: finished sentences leave in powers of two (`_live_rows`); the result
            does not depend on it.
        constraints: the batch's forced prefixes and n-gram rule (`constraints.py`), or None.
        compile: a `torch.compile` mode for the cached step (`decoder_state.py`), or None:
            eager. The result does not depend on it beyond rounding.

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
    earliest_limit = int(max_len.min())  # the batch's one read before its steps
    finished = Finished(n, k, bound + 1, n * k, device, max_len)
    decoder = DecoderState(model, src_ids, bound, n * k, use_cache, compile)
    always, early = _forbidden(cfg, device)
    # per live sentence (A,): hypotheses finished (K: done), batch index, max length; one
    # tensor, so that dropping done sentences is one op
    state = torch.stack([torch.zeros_like(max_len), torch.arange(n, device=device), max_len])
    count, alive, max_len = state
    # One row per sentence at the first step (all its beams would be the same BOS): the
    # first selection then fans each sentence out to K rows, cache included.
    scores = torch.zeros(n, 1, device=device)  # (A, W): W beams per sentence, 1 then K
    c = min(2 * k, cfg.vocab_size)  # winners per row (`best_continuations`)
    rows = candidate_rows(n, 1, c, device)  # (A, W*C): fan-out makes W = K, and then
    fanned = candidate_rows(n, k, c, device)  # fewer sentences keep a prefix of these
    rule = None if constraints is None else ConstrainedSteps(constraints, n, bound, cfg.bos_id, device)
    for step in range(bound + 1):  # by step `bound` every sentence is at its max length
        a, w = scores.size()
        logp = decoder.log_probs().index_fill_(1, early if step < min_len else always, -math.inf)
        if rule is not None:
            rule(logp, alive.repeat_interleave(w) if w > 1 else alive, step)
        forced = at_max = None
        if step >= earliest_limit:  # (A,): these sentences end here with a forced EOS
            at_max = step >= max_len
            forced = (at_max, cfg.eos_id)
        top_scores, top_rows, top_tok = best_continuations(logp, scores.view(-1), w, 2 * k,
                                                           forced, rows)  # (A, 2K)
        # EOS candidates among the first K finish; the first K others are the live beams.
        is_eos = top_tok == cfg.eos_id  # (A, 2K)
        # A done sentence's later candidates are not filed: `Finished` keeps a sentence's
        # first K, none past its max length.
        ends = torch.where(is_eos[:, :k], top_scores[:, :k], math.nan)  # (A, K)
        finished.add(step, alive, ends, top_rows[:, :k])  # NaN or -inf: none ends
        count += (ends > -math.inf).sum(dim=1)  # not the forced rows' other candidates
        if at_max is not None:
            count.masked_fill_(at_max, k)
        open_ = count < k
        if step == bound:
            break
        # the first K others, in order: a stable sort puts the EOS candidates last
        pick = torch.sort(is_eos, dim=1, stable=True).indices[:, :k]  # (A, K)
        scores = top_scores.gather(1, pick)  # (A, K)
        index, tokens = top_rows.gather(1, pick).flatten(), top_tok.gather(1, pick).flatten()
        keep = _live_rows(open_, step, sync_every, buckets)
        if keep is not None and not keep.numel():
            break
        if keep is not None:  # drop the done sentences and their rows
            index = index.view(a, -1)[keep].flatten()
            tokens = tokens.view(a, -1)[keep].flatten()
            scores, state = scores[keep], state[:, keep]
            count, alive, max_len = state
        finished.follow(step, index, tokens)
        decoder.advance(index, tokens, sentences=keep)
        if rule is not None:
            rule.advance(index, tokens, step)
        a, w = scores.size()  # W < K only where the vocabulary holds under K tokens
        rows = fanned[:a] if w == k else candidate_rows(a, w, c, device)
    return [hyps[:nbest] or [Hypothesis([], -math.inf)] for hyps in finished.hypotheses(lenpen)]


def best_continuations(
    logits: torch.Tensor, offset: torch.Tensor, w: int, n: int,
    forced_eos: tuple[torch.Tensor, int] | None = None, rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The n best (row, token) continuations of each sentence, best first.

    logits (A*W, V) of W rows per sentence; a continuation scores logits[r, v] + offset[r]
    (offset: the row's score so far; logits: its log-probabilities). Returns (scores, beam, token),
    each (A, min(n, W*V)); beam in [0, W). forced_eos: (sentences (A,) bool, eos id):
    their rows continue with EOS only, at its own score (a hypothesis at its maximum length).

    rows: None, or (A, W*C) the row number of each row's C winners (`candidate_rows`):
    then the second output is the row (of all A*W) each continuation extends, not its beam.

    A sentence's n best continuations are among each row's n best tokens, since a row's
    offset shifts all its tokens alike: so rank the (A, W*n) row winners, not (A, W*V).
    """
    c = min(n, logits.size(-1))
    row_top, row_tok = logits.topk(c, dim=-1)  # (A*W, C)
    if forced_eos is not None:  # on the (A*W, C) winners: no pass over (A*W, V)
        forced, eos = forced_eos
        forced = forced.view(-1, 1, 1)  # (A, 1, 1): a sentence's W rows alike
        only_eos = F.pad(logits[:, eos:eos + 1], (0, c - 1), value=-math.inf)  # (A*W, C)
        row_top = torch.where(forced, only_eos.view(forced.size(0), -1, c),
                              row_top.view(forced.size(0), -1, c)).view(-1, c)
        row_tok = row_tok.view(forced.size(0), -1, c).masked_fill(forced, eos).view(-1, c)
    cand = (row_top + offset[:, None]).view(-1, w * c)  # (A, W*C)
    top_scores, top_idx = cand.topk(min(n, w * c), dim=-1)  # (A, n), best first
    beam = top_idx // c if rows is None else rows.gather(1, top_idx)
    return top_scores, beam, row_tok.view(-1, w * c).gather(1, top_idx)


def candidate_rows(a: int, w: int, c: int, device: torch.device) -> torch.Tensor:
    """(A, W*C): the row (of A*W) of each of the C winners of each row, as
    `best_continuations` lays them out for a sentence's W rows."""
    return torch.arange(a * w, device=device).repeat_interleave(c).view(a, w * c)


def search(model, src_ids: torch.Tensor, cfg: DecodeConfig,
           prefixes: list[list[int] | None] | None = None,
           keys: list[int] | None = None) -> list[list[Hypothesis]]:
    """Decode src_ids (B, S) as `cfg` says; n-best lists (a list of one for greedy).

    Args:
        model (Transformer): the model (eval mode), or anything `greedy_search` and
            `beam_search` take.
        src_ids: source ids (B, S), right-padded, no BOS or EOS.
        cfg: the search: method (greedy, beam or sample), beam_size, lenpen, nbest,
            max_len_a, max_len_b, min_len, no_repeat_ngram_size, the sampling_* settings
            and seed (its other fields are `text.translate_nbest`'s).
        prefixes: None, or per sentence the ids its output must start with (or None);
            each no longer than the sentence's length limit (`text.first_unit_prefixes`).
        keys: method=sample: each sentence's `sampling.sentence_key` (from its place in
            the input); None: from its place in this batch.

    Returns:
        For each sentence, in input order, its n-best list of `Hypothesis`es, best first:
        one hypothesis for greedy search and sampling, up to cfg.nbest for beam search.

    Raises:
        ValueError: an unknown cfg.method, or settings the searches refuse.

    The host reads the device every `cfg.sync_every` steps (None: `SYNC_EVERY` of the
    device type, 1 on a CPU); rows leave in buckets where `cfg.buckets` says (None: where
    the step is compiled, on the device types of `BUCKETS`).
    """
    device = src_ids.device.type
    sync_every = cfg.sync_every or SYNC_EVERY.get(device, 1)
    compile = None if cfg.compile == "none" else cfg.compile
    buckets = cfg.buckets if cfg.buckets is not None else compile is not None and device in BUCKETS
    constraints = Constraints.build(prefixes, cfg.no_repeat_ngram_size, src_ids.device)
    if cfg.method in ("greedy", "sample"):
        sampler = (Sampler.build(cfg, keys, src_ids.size(0), src_ids.device)
                   if cfg.method == "sample" else None)
        hyps = greedy_search(model, src_ids, cfg.max_len_a, cfg.max_len_b, cfg.min_len,
                             cfg.lenpen, sync_every=sync_every, buckets=buckets,
                             constraints=constraints, compile=compile, sampler=sampler)
        return [[h] for h in hyps]
    if cfg.method == "beam":
        return beam_search(model, src_ids, cfg.beam_size, cfg.lenpen, cfg.nbest,
                           cfg.max_len_a, cfg.max_len_b, cfg.min_len, sync_every=sync_every,
                           buckets=buckets, constraints=constraints, compile=compile)
    raise ValueError(f"unknown decode.method {cfg.method!r}: expected greedy, beam or sample")
