"""What `Translator.translate` gives back: `Translation`s, with their tokens, token scores
and attention on request, made from a batch of lines (`translate_batch`).

    found = translate_batch(model, tokenizer, lines, cfg, device, nbest=None, scores=True,
                            attention=False)   # [Translation(text, score, tokens, ...), ...]

The search gives texts and scores (`text.translate_nbest`, which also hands back each
sentence's source and hypothesis ids); the token-level fields come from one
teacher-forced pass over the chosen hypotheses (`tokens.line_details`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from transformer.config import DecodeConfig
from transformer.data.corpus import normalize
from transformer.data.sentences import Segments
from transformer.data.tokenizer import Tokenizer
from transformer.decoding.arguments import as_arguments
from transformer.decoding.ct2_model import CT2Model
from transformer.decoding.settings import decode_settings
from transformer.decoding.stream import input_ready, windows
from transformer.decoding.text import Unit, _inference_mode, translate_nbest
from transformer.decoding.tokens import check_attention, line_details


@dataclass(frozen=True)
class Translation:
    """A translation and its score: the search's own, the sum of the log-probabilities of
    its tokens and EOS over GNMT's length penalty ((5 + |y|) / 6) ** lenpen; for a line of
    several sentences, the sum of its sentences' scores. `Translator.score` gives the same
    number for the same text, and for the Translation itself exactly (its tokens, cut
    where `segments` says: module `tokens.py`).

    With `return_scores=True` also:
        tokens: the target pieces (no BOS or EOS), the line's sentences one after another.
        token_scores: the log-probability of each piece and, after each sentence's last
            piece, of its EOS: for a line of one sentence len(tokens) + 1 entries, EOS
            last, and score == sum(token_scores) / ((5 + len(tokens) + 1) / 6) ** lenpen.
        segments: how many of `tokens` each unit the line was translated in wrote, in
            order (a unit: a sentence, or a piece of a sentence too long for the model):
            [len(tokens)] for a line of one sentence, [] for an empty line.
    With `return_attention=True` also:
        source_tokens: the source pieces, the line's sentences one after another.
        attention: a row per entry of token_scores, a column per source piece: the last
            decoder layer's cross-attention, averaged over its heads (each row sums to 1
            over its own sentence's source pieces).
        alignment: the source piece (an index into source_tokens) each target piece
            attends to most.
    Only `text` and `score` take part in equality.
    """

    text: str
    score: float
    tokens: list[str] | None = field(default=None, compare=False)
    token_scores: list[float] | None = field(default=None, compare=False)
    source_tokens: list[str] | None = field(default=None, compare=False, repr=False)
    attention: list[list[float]] | None = field(default=None, compare=False, repr=False)
    alignment: list[int] | None = field(default=None, compare=False, repr=False)
    segments: list[int] | None = field(default=None, compare=False, repr=False)


def translate_batch(model, tokenizer: Tokenizer, batch: list[str], cfg: DecodeConfig,
                    device: torch.device, nbest: int | None, scores: bool, attention: bool,
                    prefixes: list[list[int] | None] | None = None,
                    first_line: int = 1, segments: Segments | None = None) -> list[Any]:
    """Lines translated (`text.translate_nbest`) and shaped as `Translator.translate`
    returns them: a str or a `Translation` per line (nbest: a list of those); `scores`
    adds tokens and token scores, `attention` (a checkpoint's only) the attention.
    `segments`: the lines already split and encoded (`stream.Window`).

    Raises:
        ConfigError: a bad setting or prefix (`translate_nbest`), attention of an export.
    """
    check_attention(model, attention)
    units: list[Unit] | None = [] if scores else None
    cfg = decode_settings(cfg, device, model)  # once: translate_nbest reuses it
    found = translate_nbest(model, tokenizer, batch, cfg, device, first_line=first_line,
                            prefixes=prefixes, units=units, segments=segments)
    details = None
    if units is not None:
        exported = isinstance(model, CT2Model)
        with contextlib.nullcontext() if exported else _inference_mode(model, cfg.precision, device):
            details = line_details(model, tokenizer, units, found, cfg.batch_tokens, device,
                                   attention, cfg.min_len)
    return [shaped(hyps, nbest, scores, details[i] if details else None)
            for i, hyps in enumerate(found)]


def translate_windows(model, tokenizer: Tokenizer, lines: Iterable[str], cfg: DecodeConfig,
                      device: torch.device, nbest: int | None, scores: bool, attention: bool,
                      around: Callable[[], contextlib.AbstractContextManager]) -> Iterator[Any]:
    """`translate_batch` a window at a time (`stream.windows`: `cfg.batch_tokens` source
    tokens or lines, or what an interactive input has waiting), each inside `around()`;
    errors name the Python keywords (`arguments.as_arguments`). Attention of an export is
    refused here, at the call; the windows are read lazily."""
    check_attention(model, attention)
    return _translate_windows(model, tokenizer, lines, cfg, device, nbest, scores, attention, around)


def _translate_windows(model, tokenizer: Tokenizer, lines: Iterable[str], cfg: DecodeConfig,
                       device: torch.device, nbest: int | None, scores: bool, attention: bool,
                       around: Callable[[], contextlib.AbstractContextManager]) -> Iterator[Any]:
    done = 0
    with as_arguments():
        for window in windows(lines, tokenizer, cfg.batch_tokens, input_ready(lines),
                              max_len=model.cfg.max_positions, split=cfg.split_sentences):
            with around():
                found = translate_batch(model, tokenizer, window.lines, cfg, device, nbest,
                                        scores, attention, None, done + 1, window.segments)
            yield from found
            done += len(window.lines)


def shaped(hyps: list[tuple[str, float]], nbest: int | None, scores: bool,
           details: list[dict] | None = None) -> Any:
    """A line's n-best list as `translate` returns it (details: each entry's token-level
    fields, `tokens.line_details`)."""
    found = [Translation(*h, **(details[k] if details else {})) if scores else h[0]
             for k, h in enumerate(hyps)]
    return found[0] if nbest is None else found


def encode_prefixes(tokenizer: Tokenizer, target_prefix: object, n: int,
                    single: bool) -> list[list[int] | None] | None:
    """`target_prefix` checked (a str with a single line; else one str or None per line)
    and encoded as the sources are (normalised); None where no line has one.

    Raises:
        TypeError: a prefix that is not a str or None. ValueError: not one per line, or
            characters the vocabulary lacks (`Tokenizer.require_known`).
    """
    if target_prefix is None:
        return None
    if isinstance(target_prefix, str) != single:
        raise TypeError("target_prefix: give a str with a single line, a list of str "
                        "(or None) with a list of lines")
    texts = [target_prefix] if single else list(target_prefix)  # type: ignore[call-overload]
    if len(texts) != n:
        raise ValueError(f"target_prefix holds {len(texts)} entries for {n} lines: give one "
                         "per line (None for none)")
    for i, t in enumerate(texts):
        if t is not None and not isinstance(t, str):
            raise TypeError(f"target_prefix[{i}] is a {type(t).__name__}, not a str or None")
    for i, t in enumerate(texts):
        if t:
            tokenizer.require_known(normalize(t), "target_prefix" if single else f"target_prefix[{i}]")
    ids = [tokenizer.encode([normalize(t)])[0] if t else None for t in texts]
    return ids if any(ids) else None
