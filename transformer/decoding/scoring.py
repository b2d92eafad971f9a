"""Forced scoring: the model's score of given translations, as the search scores its own.

Shapes: B batch (pairs), S source length, T target length + 1 (BOS in, EOS out), V vocabulary,
N the non-padding target positions of a batch.

    scores = score_lines(model, tokenizer, ["Ciao!"], ["Hi!"], DecodeConfig())   # [-1.23]

A hypothesis of `search.search` scores the sum of the log-probabilities of its tokens and
of its EOS, divided by GNMT's length penalty ((5 + |y|) / 6) ** lenpen (|y| with the EOS).
The search's constraints (EOS forbidden before min_len, forced at the length limit) choose
tokens but never change a token's log-probability, so teacher forcing the same tokens
gives the same number: `unit_scores` computes exactly that, in batches of `batch_tokens`
(here pairs times the batch's longest source or target + 1: both sides are read).

A CTranslate2 export (`ct2_model.CT2Model`) is scored with its `score_batch` and the same
length penalty, plus what CTranslate2's own search adds: it masks EOS *before* its softmax
for the first min_len steps, so those steps' other tokens score log p - log(1 - p(EOS))
(see ct2_model.py). `unit_scores` adds that term, read from `score_batch` on the prefixes,
so an export's hypothesis too scores the same both ways.

A line is scored as `text.translate_nbest` translates it (`score_lines`): split into
sentences (decode.split_sentences) and a sentence too long for the model into pieces,
each unit scored against its part of the translation, the scores summed, which is how a
line's n-best score is made (`text.join_nbest`). A translation that comes with its
segmentation (`Translation.segments`: how many of its pieces each unit wrote) is cut
there, so the search's own translation scores exactly what the search scored, whatever
its sentences. A text is cut into its parts by the same sentence splitter; a line whose
text does not split into as many sentences as its source has units (a sentence
translated as two) is scored whole, source line against translation, with one warning
naming the lines, and refused where the source is longer than the model reads (it was
translated in parts, and only its translation's segmentation pairs them). A list of pieces
without a segmentation is one part, not tokenised again.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Sequence

import torch

from transformer.config import DecodeConfig
from transformer.data.batching import length_batches, pad
from transformer.data.corpus import normalize
from transformer.data.sentences import segment, split_sentences
from transformer.data.tokenizer import Tokenizer
from transformer.decoding.ct2_model import CT2Model
from transformer.decoding.search import length_penalty, logsumexp
from transformer.decoding.settings import CPU_BATCH_TOKENS, decode_settings
from transformer.decoding.text import _inference_mode
from transformer.decoding.tokens import token_details

log = logging.getLogger(__name__)


def unit_scores(model, src: Sequence[list[int]], tgt: Sequence[list[int]], cfg: DecodeConfig,
                device: torch.device) -> list[float]:
    """The search's score of each target `tgt[i]` (ids, no BOS or EOS) for source `src[i]`
    (ids, no BOS or EOS, at most max_positions): the log-probabilities of its tokens and
    EOS, summed, over ((5 + |y|) / 6) ** cfg.lenpen.

    The model runs in the mode and precision the caller set up (`score_lines` does).

    Raises:
        ValueError: a target longer than the model writes (max_positions - 1 tokens with
            its EOS), named by its index.
    """
    longest = model.cfg.max_positions - 1  # BOS takes a position
    for i, ids in enumerate(tgt):
        if len(ids) > longest or len(src[i]) > model.cfg.max_positions:
            raise ValueError(f"pair {i + 1}: {len(src[i])} source and {len(ids)} target tokens; "
                             f"this model reads at most {model.cfg.max_positions} and writes at "
                             f"most {longest} before its EOS")
    if isinstance(model, CT2Model):
        totals = _ct2_totals(model, src, tgt, cfg.min_len)
    else:
        totals = _totals(model, src, tgt, cfg.batch_tokens or CPU_BATCH_TOKENS, device)
    return [total / length_penalty(len(ids) + 1, cfg.lenpen) for total, ids in zip(totals, tgt, strict=True)]


def _totals(model, src: Sequence[list[int]], tgt: Sequence[list[int]], batch_tokens: int,
            device: torch.device) -> list[float]:
    """Sum of log p(token) over each target and its EOS, teacher-forced, batched by length."""
    cfg = model.cfg
    totals = [0.0] * len(src)
    lengths = [max(len(s), len(t) + 1, 1) for s, t in zip(src, tgt, strict=True)]
    for batch in length_batches(lengths, batch_tokens):
        src_ids = pad([src[i] or [cfg.pad_id] for i in batch], cfg.pad_id).to(device)  # (B, S)
        tgt_in = pad([[cfg.bos_id, *tgt[i]] for i in batch], cfg.pad_id).to(device)  # (B, T)
        tgt_out = pad([[*tgt[i], cfg.eos_id] for i in batch], cfg.pad_id).to(device)  # (B, T)
        sizes = torch.tensor([len(tgt[i]) + 1 for i in batch], device=device)  # (B,)
        real = torch.arange(tgt_in.size(1), device=device)[None] < sizes[:, None]  # (B, T) BOS + target
        logits = model(src_ids, tgt_in, predict_mask=real).float()  # (N, V)
        picked = logits.gather(1, tgt_out[real][:, None]).squeeze(1) - logsumexp(logits)  # (N,)
        per_row = torch.zeros(len(batch), dtype=torch.float64, device=device)
        rows = torch.arange(len(batch), device=device)[:, None].expand_as(real)[real]  # (N,)
        per_row.index_add_(0, rows, picked.double())
        for row, value in zip(batch, per_row.tolist(), strict=True):  # one read per batch
            totals[row] = value
    return totals


def _ct2_totals(model: CT2Model, src: Sequence[list[int]], tgt: Sequence[list[int]],
                min_len: int) -> list[float]:
    """An export's sums, as its search scores: `score_batch`'s log-probabilities, plus
    -log(1 - p(EOS | y_<t)) for each token step t < min_len (CTranslate2 renormalises the
    steps where EOS is masked)."""
    return [sum(lp) for lp in model.log_probs(list(src), list(tgt), min_len)]


def score_lines(model, tokenizer: Tokenizer, sources: Sequence[str],
                targets: Sequence[str | list[str]], cfg: DecodeConfig,
                device: torch.device, details: list | None = None,
                segments: Sequence[list[int] | None] | None = None) -> list[float]:
    """The score of each line's translation, as `text.translate_nbest` scores a line: the
    sum of its units' scores (0.0 for an empty source and translation).

    Each source line is split as translation splits it (cfg.split_sentences, pieces of
    a sentence longer than the model's table included); its translation is cut where its
    `segments` say, else by the same sentence splitter. If the counts agree the i-th unit
    is scored against the i-th part; else the line is scored whole (one warning names
    those lines) where its source fits the model.

    Args:
        model (Transformer | CT2Model): the model (put in eval mode for the call, under
            autocast to cfg.precision), or an export's `CT2Model`.
        tokenizer: the model's SentencePiece tokenizer.
        sources: the source lines.
        targets: their translations, one per source line: a text, or the pieces of one
            (`Translation.tokens`), taken as they are (no tokenising again), paired with
            a source of one sentence (else the line is scored whole), or cut into the
            source's units by `segments`.
        cfg: the settings (their device defaults filled in here, `settings.decode_settings`,
            unless they are already): lenpen, split_sentences, batch_tokens, precision;
            min_len for an export.
        device: where the model is.
        details: if given, receives per line the log-probabilities of its pieces and
            EOS (each sentence's EOS after its pieces), `tokens.token_details`.
        segments: None, or per line None or the number of pieces each of the source's
            units (a sentence not empty, or a piece of one) wrote (`Translation.segments`).

    Returns:
        One score per line, as `text.translate_nbest` scores the line's translation.

    Raises:
        ValueError: a translation (or a sentence of it) longer than the model writes; a
            segmentation that does not fit its source's units or its pieces; a line to be
            scored whole whose source is longer than the model reads.
        ConfigError: settings the model or device cannot run.
    """
    cfg = decode_settings(cfg, device, model)
    limit = model.cfg.max_positions
    segs = segment(sources, tokenizer, limit, cfg.split_sentences)
    units: list[list[list[int]]] = [[] for _ in sources]
    for owner, ids in zip(segs.owner, segs.ids, strict=True):
        units[owner].append(ids)
    src: list[list[int]] = []
    texts: list[str | list[str]] = []
    owner: list[int] = []
    whole: list[int] = []
    for i, line_units in enumerate(units):
        cuts = segments[i] if segments is not None else None
        if cuts is not None:
            line_units, line_parts = _as_translated(i, line_units, targets[i], cuts)
        else:
            line_parts = _parts(targets[i], cfg.split_sentences)
        if not line_units and not line_parts:
            continue  # an empty line, translated as ""
        if len(line_units) != len(line_parts):
            whole.append(i)
            line_units = [_whole_source(i, sources[i], tokenizer, limit, len(line_units),
                                        len(line_parts))]
            line_parts = [t if isinstance(t := targets[i], list) else normalize(t)]
        src += line_units
        texts += line_parts
        owner += [i] * len(line_units)
    if whole:
        shown = ", ".join(str(i + 1) for i in whole[:10]) + (", ..." if len(whole) > 10 else "")
        log.warning("%d line(s) whose translation does not split into as many sentences as the "
                    "source were scored whole (line %s)", len(whole), shown)
    tgt = _target_ids(tokenizer, texts, owner)
    for i, ids in zip(owner, tgt, strict=True):
        if len(ids) >= limit:  # BOS takes a position
            raise ValueError(f"target {i + 1}: a translation of {len(ids)} tokens (or a sentence "
                             f"of it); this model writes at most {limit - 1}")
    scores = [0.0] * len(sources)
    exported = isinstance(model, CT2Model)
    with contextlib.nullcontext() if exported else _inference_mode(model, cfg.precision, device):
        found = unit_scores(model, src, tgt, cfg, device)
        if details is not None:
            per_unit = token_details(model, src, tgt, cfg.batch_tokens or CPU_BATCH_TOKENS, device,
                                     min_len=cfg.min_len)
            details.extend([] for _ in sources)
            for i, detail in zip(owner, per_unit, strict=True):
                details[i].extend(detail.log_probs)
    for i, value in zip(owner, found, strict=True):
        scores[i] += value
    return scores


def _parts(target: str | list[str], split: bool) -> list[str | list[str]]:
    """A translation's parts, to pair with its source's units: a text's sentences (`split`)
    or the text; a list of pieces is one part ([] for no pieces, as for "")."""
    if isinstance(target, list):
        return [target] if target else []
    return split_sentences(target) if split else [t for t in [normalize(target)] if t]


def _as_translated(i: int, line_units: list[list[int]], pieces: str | list[str],
                   cuts: list[int]) -> tuple[list[list[int]], list[str | list[str]]]:
    """A line's units that were decoded (those not empty) and its pieces cut where `cuts`
    (`Translation.segments`) says, one part each; ValueError naming the target where
    they do not fit."""
    decoded = [ids for ids in line_units if ids]
    if not isinstance(pieces, list):
        raise ValueError(f"targets[{i}]: segments cut a list of pieces, not a text")
    if sum(cuts) != len(pieces):
        raise ValueError(f"targets[{i}]: its segments {cuts} do not add up to its "
                         f"{len(pieces)} tokens: give the Translation as translate() returned it")
    if len(cuts) != len(decoded):
        raise ValueError(f"targets[{i}]: a translation of {len(cuts)} sentences or pieces for a "
                         f"source of {len(decoded)}: score it with the line and split_sentences "
                         "it was translated with")
    ends = list(itertools.accumulate(cuts))
    return decoded, [pieces[end - n:end] for end, n in zip(ends, cuts, strict=True)]


def _whole_source(i: int, line: str, tokenizer: Tokenizer, limit: int, units: int,
                  parts: int) -> list[int]:
    """The ids of a source line scored whole; ValueError naming the model's limit where
    it holds more (it was translated in parts that nothing here pairs with the target's)."""
    ids = tokenizer.encode([normalize(line)])[0]
    if len(ids) > limit:
        raise ValueError(f"line {i + 1}: a source of {len(ids)} tokens, translated in {units} "
                         f"sentences or pieces, and a translation of {parts}: it cannot be scored "
                         f"whole, as this model reads at most {limit} tokens (model.max_positions); "
                         "give the Translation itself, whose segments pair them")
    return ids


def _target_ids(tokenizer: Tokenizer, texts: list[str | list[str]], owner: list[int]) -> list[list[int]]:
    """The ids of each target part: a text encoded, pieces looked up (ValueError naming
    the target of a piece not in the vocabulary, or of a control symbol)."""
    encoded = iter(tokenizer.encode([t for t in texts if isinstance(t, str)]) if texts else [])
    ids = []
    for i, t in zip(owner, texts, strict=True):
        if isinstance(t, str):
            ids.append(next(encoded))
            continue
        try:
            ids.append(tokenizer.piece_ids(t))
        except ValueError as e:
            raise ValueError(f"targets[{i}]: {e}") from None
    return ids
