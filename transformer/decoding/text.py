"""Translating text with a model: normalise, split into sentences, encode, batch by
length, search, decode.

The library behind `mt-translate`, `mt-evaluate` and the trainer's dev BLEU:

    model, tokenizer, device = load_for_inference("runs/x/checkpoints/best", "auto")
    translate_lines(model, tokenizer, ["Ciao!"], DecodeConfig(method="greedy"))  # ["Hi!"]
    translate_nbest(model, tokenizer, lines, DecodeConfig(nbest=3))   # [[(text, score), ...]]

Each line is split into sentences first (`transformer.data.sentences`; decode.split_sentences)
and put back together after, so a paragraph translates as its sentences do.

The settings are resolved by `settings.decode_settings` (device defaults filled in, checked
against the model), once per call: a config it resolved is reused as it is. The model
may be a CTranslate2 export (mt-export, `transformer/decoding/ct2_model.py`): a
`CT2Model`, which `translate_nbest` asks for its own search instead of `search.search`.
`load_for_inference`, the commands' loader, lives in `loading.py` and is importable from
here too.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from tqdm import tqdm

from transformer.config import ConfigError, DecodeConfig
from transformer.data.batching import length_batches, pad
from transformer.data.sentences import Segments, join_texts, segment
from transformer.data.tokenizer import Tokenizer
from transformer.decoding.batch_memory import check_decode_memory
from transformer.decoding.ct2_model import CT2Model
from transformer.decoding.loading import load_for_inference as load_for_inference  # re-exported
from transformer.decoding.sampling import unit_keys
from transformer.decoding.search import search
from transformer.decoding.settings import DTYPES, decode_settings
from transformer.model.weights import held_in

log = logging.getLogger(__name__)


def check_length_limits(cfg: DecodeConfig, src: list[list[int]], max_positions: int) -> None:
    """Refuse a min_len the model cannot write; say when it lifts a sentence's max length.

    A hypothesis holds at most max_positions - 1 tokens (BOS takes a position); search
    raises the limit a * |x| + b of a sentence to min_len where that is below it.
    """
    longest = max_positions - 1
    if cfg.min_len > longest:
        raise ConfigError(f"decode.min_len={cfg.min_len}: this model writes at most {longest} "
                          f"tokens (its max_positions={max_positions}, one position for BOS)")
    lifted = sum(1 for ids in src if ids and int(cfg.max_len_a * len(ids) + cfg.max_len_b) < cfg.min_len)
    if lifted:
        log.warning("decode.min_len=%d is above the length limit a * |x| + b (a=%s, b=%d) of %d "
                    "sentence(s): their limit is raised to min_len", cfg.min_len, cfg.max_len_a,
                    cfg.max_len_b, lifted)


def translate_nbest(
    model,
    tokenizer: Tokenizer,
    lines: list[str],
    cfg: DecodeConfig,
    device: torch.device | str | None = None,
    progress: bool = False,
    after_batch: Callable[[], object] | None = None,
    counts: dict[str, int] | None = None,
    first_line: int = 1,
    prefixes: Sequence[list[int] | None] | None = None,
    units: list[Unit] | None = None,
    segments: Segments | None = None,
) -> list[list[tuple[str, float]]]:
    """The n-best (text, score) list of every line, in input order.

    Each line is split into sentences (cfg.split_sentences, `sentences.segment`) and a
    sentence longer than the model's max_positions into pieces; all of them are decoded
    together and each line's translations joined again (`join_nbest`). `counts`, if given,
    receives the numbers of lines, sentences and decoded units (sentences and pieces).
    Empty lines are not decoded: they give [("", 0.0)]. Our model is put in eval mode
    for the call and restored afterwards, its weights held in cfg.precision's dtype
    meanwhile (copies where they are in another); an exported model (`ct2_model.CT2Model`) runs its
    own search on the same batches. `after_batch` is called after each decoding batch
    (training's validation gives its `device.HeapTrimmer`: each batch's key/value caches,
    sized to its length bound, leave heap holes of many lengths).

    Args:
        model (Transformer | CT2Model): the model (a DistributedDataParallel wrapper is
            unwrapped), or a CTranslate2 export's `CT2Model` (`load_for_inference`).
        tokenizer: the model's SentencePiece tokenizer.
        lines: the input lines (a sentence or a paragraph each); "" or blanks give "".
        cfg: the decode settings; their device-dependent defaults are filled in and
            checked against the model (`decode_settings`).
        device: where the model is; None: where its weights are (an export's device).
        progress: show a tqdm bar on stderr, counting sentences.
        after_batch: called with no arguments after each decoding batch.
        counts: if given, receives `lines`, `sentences` and `units` (decoded sentences
            and pieces of long ones).
        first_line: the number warnings give `lines[0]` (`stream.iter_nbest` translates
            a file a window at a time).
        prefixes: None, or per line the target ids its translation must start with (or
            None): they force the first sentence's first tokens (`constraints.py`).
        units: if given, receives a `Unit` per decoded sentence (and piece), in reading
            order: its line, its source ids and its hypotheses' ids (`Translator`'s tokens).
        segments: `lines` already split into sentences and encoded (`sentences.segment`,
            with the model's max_positions and cfg.split_sentences), as `stream.windows`
            gives them: each line is then encoded once; None: done here.

    Returns:
        For each line, in input order, its n-best list of (text, score), best first: one
        entry for greedy search, up to cfg.nbest for beam search, [("", 0.0)] for an empty
        line. A line of several sentences joins their k-th hypotheses and sums their scores.

    Raises:
        ConfigError: settings out of range, or that the model or device cannot run (a
            min_len longer than the model writes, fp16 on a CPU, a precision other than
            auto for an export, batches larger than the free memory), named by their
            `decode.*` key; a prefix longer than its sentence's length limit.
    """
    model = getattr(model, "module", model)  # DistributedDataParallel wraps the model
    exported = isinstance(model, CT2Model)
    if device is None:
        device = model.device if exported else next(model.parameters()).device
    device = torch.device(device)
    cfg = decode_settings(cfg, device, model)
    segs = segments if segments is not None else segment(lines, tokenizer, model.cfg.max_positions,
                                                         cfg.split_sentences)
    if segs.n_lines != len(lines):
        raise ValueError(f"segments of {segs.n_lines} lines given with {len(lines)} lines")
    _warn_long(segs, model.cfg.max_positions, first_line)
    if counts is not None:
        counts.update(lines=len(lines), sentences=segs.sentences, units=len(segs.ids))
    src = segs.ids
    check_length_limits(cfg, src, model.cfg.max_positions)
    unit_prefix = first_unit_prefixes(segs.owner, prefixes, src, cfg, model.cfg.max_positions,
                                      first_line)
    results: list[list[tuple[str, float]]] = [[("", 0.0)] for _ in src]
    hyp_ids: list[list[list[int]]] = [[[]] for _ in src]
    todo = [i for i, ids in enumerate(src) if ids]
    lengths = [len(src[i]) for i in todo]
    batches = list(length_batches(lengths, cfg.batch_tokens, cfg.max_batch_size))
    check_decode_memory(model.cfg, [[lengths[j] for j in b] for b in batches], cfg, device)
    bar = tqdm(total=len(todo), unit="sent", file=sys.stderr, disable=not progress)
    mode = contextlib.nullcontext() if exported else _inference_mode(model, cfg.precision, device)
    # sampling: each unit's draws keyed by its place in the input, not by its batch
    keys = unit_keys(cfg.seed, segs.owner, first_line) if cfg.method == "sample" else None
    with mode:
        for batch in batches:
            index = [todo[j] for j in batch]
            src_ids = pad([src[i] for i in index], tokenizer.pad_id).to(device)
            prefix = [unit_prefix[i] for i in index] if unit_prefix is not None else None
            found = (model.search(src_ids, cfg, prefix) if exported else
                     search(model, src_ids, cfg, prefix, None if keys is None else [keys[i] for i in index]))
            for i, hyps in zip(index, found, strict=True):
                texts = tokenizer.decode([h.tokens for h in hyps])
                results[i] = [(t, h.score) for t, h in zip(texts, hyps, strict=True)]
                hyp_ids[i] = [h.tokens for h in hyps]
            bar.update(len(index))
            if after_batch is not None:
                after_batch()
    bar.close()
    if units is not None:
        units.extend(Unit(line, ids, hyps) for line, ids, hyps in zip(segs.owner, src, hyp_ids,
                                                                         strict=True))
    return segs.rejoin(results, join_nbest, [("", 0.0)])


@dataclass
class Unit:
    """A decoded sentence (or piece of one): its line, source ids and hypotheses' ids."""

    line: int
    src: list[int]
    hyps: list[list[int]]


def first_unit_prefixes(owner: list[int], prefixes: Sequence[list[int] | None] | None,
                        src: list[list[int]], cfg: DecodeConfig, max_positions: int,
                        first_line: int = 1) -> list[list[int] | None] | None:
    """Each unit's forced prefix: a line's prefix goes to its first unit; None if no line
    has one. ConfigError for a prefix longer than its sentence's length limit (a prefix
    of an empty line is left out: it has no sentence)."""
    if prefixes is None or not any(prefixes):
        return None
    out: list[list[int] | None] = [None] * len(owner)
    seen: set[int] = set()
    for u, line in enumerate(owner):
        if line in seen:
            continue
        seen.add(line)
        ids = prefixes[line]
        if not ids:
            continue
        if len(ids) > max_positions - 1:  # no setting lifts the model's own limit
            raise ConfigError(f"target_prefix of line {line + first_line}: {len(ids)} tokens, above "
                              f"this model's limit of {max_positions - 1} (model.max_positions="
                              f"{max_positions}, one of them the BOS): shorten the prefix")
        limit = min(max_positions - 1, max(cfg.min_len, int(cfg.max_len_a * len(src[u]) + cfg.max_len_b)))
        if len(ids) > limit:
            raise ConfigError(f"target_prefix of line {line + first_line}: {len(ids)} tokens, above "
                              f"its length limit of {limit} (a * |x| + b, a={cfg.max_len_a}, "
                              f"b={cfg.max_len_b}): raise decode.max_len_b")
        out[u] = ids
    return out


def join_nbest(parts: list[list[tuple[str, float]]]) -> list[tuple[str, float]]:
    """The n-best list of a line from those of its sentences: the k-th entry joins the
    sentences' k-th hypotheses and sums their scores (exact for a line of one sentence)."""
    if len(parts) == 1:
        return parts[0]
    n = min(len(p) for p in parts)
    return [(join_texts([p[k][0] for p in parts]), sum(p[k][1] for p in parts)) for k in range(n)]


def _warn_long(segs: Segments, max_len: int, first_line: int = 1) -> None:
    """One warning for lines with a sentence cut into pieces, one for any truncated word."""
    def shown(lines: list[int]) -> str:
        return ", ".join(str(i + first_line) for i in lines[:10]) + (", ..." if len(lines) > 10 else "")

    if segs.cut:
        log.warning("%d input line(s) hold a sentence longer than the model's limit of %d tokens: "
                    "translated in pieces cut at clause or word boundaries (line %s)",
                    len(segs.cut), max_len, shown(segs.cut))
    if segs.truncated:
        log.warning("%d input line(s) hold a single word longer than the model's limit of %d "
                    "tokens: its end was cut off (line %s)", len(segs.truncated), max_len,
                    shown(segs.truncated))


@contextlib.contextmanager
def _inference_mode(model: torch.nn.Module, precision: str, device: torch.device):
    """Eval mode, no autograd, the weights in `precision`'s dtype; the model's mode (and
    weights) restored after.

    A model already in eval mode is left untouched (its mode is not written): a
    `Translator` puts its model in eval mode once, so that threads sharing it never flip
    its mode. The model computes in its weights' dtype, without autocast, as CTranslate2
    computes in its `compute_type`: a model held in another dtype (fp32 for training, or
    as loaded) gets copies in this one for the call (`weights.held_in`), cast once rather
    than by autocast at every product of every step.
    """
    was_training = model.training
    if was_training:
        model.eval()
    try:
        with held_in(model, DTYPES[precision]), torch.inference_mode():
            yield
    finally:
        if was_training:
            model.train()


def translate_lines(
    model,
    tokenizer: Tokenizer,
    lines: list[str],
    cfg: DecodeConfig,
    device: torch.device | str | None = None,
    progress: bool = False,
    after_batch: Callable[[], object] | None = None,
    counts: dict[str, int] | None = None,
) -> list[str]:
    """The best translation of every line, in input order ("" for an empty line).

    `translate_nbest`, keeping each line's best hypothesis: what `mt-translate` writes.

    Args:
        model (Transformer | CT2Model): the model, or a CTranslate2 export's `CT2Model`.
        tokenizer: the model's SentencePiece tokenizer.
        lines: the input lines (a sentence or a paragraph each).
        cfg: the decode settings (cfg.nbest is decoded, only the best is kept).
        device: where the model is; None: where its weights are.
        progress: show a tqdm bar on stderr, counting sentences.
        after_batch: called with no arguments after each decoding batch.
        counts: if given, receives `lines`, `sentences` and `units`.

    Returns:
        One translation per line, in input order.

    Raises:
        ConfigError: settings the model or device cannot run, named by their key.
    """
    nbest = translate_nbest(model, tokenizer, lines, cfg, device, progress, after_batch, counts)
    return [hyps[0][0] for hyps in nbest]


def format_nbest(nbest: list[list[tuple[str, float]]], start: int = 0) -> list[str]:
    """fairseq-like n-best lines: `i ||| hypothesis ||| score`, i counting from `start`."""
    return [f"{i} ||| {text} ||| {score:.4f}"
            for i, hyps in enumerate(nbest, start) for text, score in hyps]
