"""`Translator`: the package's Python face, text in and text out, as `mt-translate` does it.

    from transformer import Translator

    translator = Translator.load("runs/tatoeba_cpu/checkpoints/best")  # or an mt-export directory
    translator.translate(["Ciao, come stai?", "Che ore sono?"])         # ["Hi, how are you?", ...]
    translator.translate(lines, method="greedy", max_len_b=20)          # any decode.* setting
    translator.translate(lines, nbest=3, return_scores=True)            # [[Translation(text, score), ...], ...]
    translator.translate(lines, method="sample", sampling_topk=10, seed=1)  # drawn, the same for a seed
    for text in translator.translate_iterable(open("news.it")):         # lazily, a batch at a time
        print(text)
    translator.score(["Ciao!"], ["Hi!"])                                # the model's score of a translation

What fairseq's `from_pretrained(...).translate()` and CTranslate2's `Translator` do, on
this project's library: `load` reads a checkpoint directory or a CTranslate2 export,
`translate` is `text.translate_nbest` (normalise, split into sentences, batch by length,
search, rejoin), so a list of lines translates exactly as `mt-translate` translates the
same lines from a file with the same settings; `translate_iterable` is
`stream.iter_nbest` (the command's reading too), `score` is `scoring.score_lines`. The
settings are `config.DecodeConfig`'s fields by name, checked as mt-translate checks them;
a bad one raises `ConfigError` naming the keyword (`beam_size=0: must be >= 1`).

Loading changes nothing process-wide: glibc's allocator is left as it is (the `mt-*`
commands, which own their process, tune it: `device.keep_large_blocks_in_the_heap`) and
so are torch's threads. One thing a call does change for the whole process: `threads`
sets torch's intra-op thread count (a process-wide setting) while the translator's calls
run, and restores it when the last of them ends (`arguments.torch_threads`); other torch
work running meanwhile runs with that count too.

Threads: one Translator may serve several Python threads at once. Each call keeps its
settings to itself (nothing a call is given is written on the Translator), the model is
put in eval mode once, when the Translator is made, and never flipped by a call, and the
batch sizes are resolved once (`batch_tokens`, `max_batch_size`), so each thread gets what
the same calls made one after another would give. Not safe: changing the Translator's
`decode`, or the model itself (`model.train()`, new weights), while calls run.
"""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, overload

import torch

from transformer.checkpoint import CheckpointError, load_model
from transformer.config import ConfigError, DecodeConfig, at_most_workers, check_device, positive
from transformer.data.tokenizer import Tokenizer
from transformer.decoding.arguments import (
    SETTINGS,
    as_arguments,
    as_lines,
    as_pairs,
    check_iterable,
    check_path,
    decode_config,
    torch_threads,
)
from transformer.decoding.ct2_model import CT2Model, is_export, load_export
from transformer.decoding.scoring import score_lines
from transformer.decoding.settings import DTYPES, decode_settings, resolved
from transformer.decoding.translations import (
    Translation,
    encode_prefixes,
    translate_batch,
    translate_windows,
)
from transformer.device import PRECISIONS, resolve_device, resolve_precision
from transformer.model.transformer import Transformer
from transformer.model.weights import DtypeCopies, floating_dtype, rounds_to

__all__ = ["SETTINGS", "Translation", "Translator", "decode_config"]
log = logging.getLogger(__name__)


class Translator:
    """A model and its tokenizer, ready to translate lines of Italian into English.

    Build one with `Translator.load(path)`. `model`: a `Transformer` or a `CT2Model`;
    `tokenizer` its SentencePiece model; `device` where it runs; `decode` the settings
    `translate` starts from (batch sizes resolved once); `threads` torch's threads during
    its calls. Python threads may share one (module docstring).
    """

    def __init__(self, model: Transformer | CT2Model, tokenizer: Tokenizer, *,
                 device: torch.device | str | None = None, decode: DecodeConfig | None = None,
                 path: Path | None = None, threads: int | None = None) -> None:
        """A Translator for a model in memory on `device` (None: where its weights are), in
        eval mode from here on; `decode` checked and resolved once; `path` for `repr`."""
        model = getattr(model, "module", model)  # DistributedDataParallel wraps the model
        if device is None:
            device = model.device if isinstance(model, CT2Model) else next(model.parameters()).device
        device = torch.device(device)
        with as_arguments():
            _check_threads(threads)
            decode = DecodeConfig() if decode is None else decode  # `load`'s comes resolved
            self.decode = copy.copy(decode) if resolved(decode, device, model) else \
                decode_settings(decode_config(decode, {}), device, model)  # a copy: its own
        if not isinstance(model, CT2Model):
            model.eval()  # once: calls never flip it (threads may share the model)
        self.model, self.tokenizer, self.device, self.path = model, tokenizer, device, path
        self.threads = None if isinstance(model, CT2Model) else threads
        self._copies = None if isinstance(model, CT2Model) else DtypeCopies(model)  # per dtype

    @classmethod
    def load(cls, path: str | Path, *, device: str | torch.device = "auto", precision: str = "auto",
             threads: int | None = None, dtype: str = "auto", **settings: Any) -> Translator:
        """Load a checkpoint directory, a run directory or a CTranslate2 export (`mt-export`).

        Args:
            path: a checkpoint directory (`model.json`, ...), an export (`export.json`) or a
                run directory (as `checkpoint=RUN_DIR`: its best checkpoint, else its newest).
            device: `auto` (CUDA where there is a GPU), `cpu`, `cuda`, `cuda:N`.
            precision: `auto` (fp32 on a CPU, as an export computes there; bf16 on a GPU
                that has it, else fp16), `fp32`, `bf16`, `fp16` (CUDA); an export: `auto`.
            dtype: the weights' (CTranslate2's `compute_type`; `auto`: precision's); a call in
                another precision decodes on a copy, of the checkpoint's own weights where
                these are rounded (`_checkpoint_in`). An export: `auto`.
            threads: a checkpoint: torch's threads during the calls (None: as they are);
                an export: CTranslate2's workers (None: 2). mt-translate's `threads`.
            **settings: defaults for `translate` by `DecodeConfig` field name (not `nbest`).

        Raises:
            CheckpointError: not a checkpoint, a run or an export, or a broken one (path named).
            ConfigError: a bad device, thread count or setting (keyword named), or an
                export without ctranslate2 (`pip install -e ".[export]"`).
        """
        with as_arguments():
            model, tokenizer, where, torch_device, decode, rounded = _open(path, str(device), precision, threads, settings, dtype)
        translator = cls(model, tokenizer, device=torch_device, decode=decode, path=where, threads=threads)
        if rounded:  # a call in another dtype decodes on the checkpoint's own weights
            translator._copies = DtypeCopies(model, functools.partial(
                _checkpoint_in, where, model, torch_device))
        return translator

    # a str gives one result, an iterable a list; nbest: a list each; return_scores: Translations
    @overload
    def translate(self, lines: str, *, nbest: None = None, return_scores: Literal[False] = False, **settings: Any) -> str: ...
    @overload
    def translate(self, lines: str, *, nbest: int, return_scores: Literal[False] = False, **settings: Any) -> list[str]: ...
    @overload
    def translate(self, lines: str, *, nbest: None = None, return_scores: Literal[True], **settings: Any) -> Translation: ...
    @overload
    def translate(self, lines: str, *, nbest: int, return_scores: Literal[True], **settings: Any) -> list[Translation]: ...
    @overload
    def translate(self, lines: Iterable[str], *, nbest: None = None, return_scores: Literal[False] = False, **settings: Any) -> list[str]: ...
    @overload
    def translate(self, lines: Iterable[str], *, nbest: int, return_scores: Literal[False] = False, **settings: Any) -> list[list[str]]: ...
    @overload
    def translate(self, lines: Iterable[str], *, nbest: None = None, return_scores: Literal[True], **settings: Any) -> list[Translation]: ...
    @overload
    def translate(self, lines: Iterable[str], *, nbest: int, return_scores: Literal[True], **settings: Any) -> list[list[Translation]]: ...

    def translate(self, lines: str | Iterable[str], *, nbest: int | None = None,
                  return_scores: bool = False, return_attention: bool = False,
                  target_prefix: str | Iterable[str | None] | None = None,
                  **settings: Any) -> Any:
        """Translate lines, as `mt-translate` translates the lines of a file.

        Each line is split into sentences, translated (batched by length) and joined
        again: one result per line, in order; "" gives "". All lines are read first.

        Args:
            lines: the Italian lines; a single string is one line.
            nbest: None: each line's best. k: a list of its k best, best first (beam
                search, k <= beam_size; an empty line gives [""]).
            return_scores: give `Translation`s: the search's score (a line of several
                sentences: the sum of theirs; an empty line: 0.0), `tokens`, `token_scores`.
            return_attention: also `source_tokens`, `attention`, `alignment` (a checkpoint's).
            target_prefix: a text per line (a str for a single line) or None: forced
                first pieces, scored as the model scores them (`Translation`).
            **settings: this call's decode settings, by `DecodeConfig` field name; the
                others are the Translator's (`load`'s, else beam 5, lenpen 0.6).

        Returns per line (for a str, one) a str or a `Translation`; with `nbest` a list.

        Raises:
            ConfigError: a bad setting (named: `beam_size=0`), a prefix past its line's
                length limit, attention of an export.
            TypeError: a line that is not a str, or bytes. ValueError: not one prefix a line.
            CheckpointError: a wider precision whose checkpoint changed (`_checkpoint_in`).
        """
        batch, single = as_lines(lines)
        cfg = self._config(settings, nbest)
        prefixes = encode_prefixes(self.tokenizer, target_prefix, len(batch), single)
        with as_arguments(), torch_threads(self.threads):
            out = translate_batch(self._in_dtype(cfg), self.tokenizer, batch, cfg, self.device, nbest,
                                  return_scores or return_attention, return_attention, prefixes)
        return out[0] if single else out

    @overload
    def translate_iterable(self, lines: Iterable[str], *, nbest: None = None, return_scores: Literal[False] = False, **settings: Any) -> Iterator[str]: ...
    @overload
    def translate_iterable(self, lines: Iterable[str], *, nbest: int, return_scores: Literal[False] = False, **settings: Any) -> Iterator[list[str]]: ...
    @overload
    def translate_iterable(self, lines: Iterable[str], *, nbest: None = None, return_scores: Literal[True], **settings: Any) -> Iterator[Translation]: ...
    @overload
    def translate_iterable(self, lines: Iterable[str], *, nbest: int, return_scores: Literal[True], **settings: Any) -> Iterator[list[Translation]]: ...

    def translate_iterable(self, lines: Iterable[str], *, nbest: int | None = None,
                           return_scores: bool = False, return_attention: bool = False,
                           **settings: Any) -> Iterator[Any]:
        """Translate any iterable of lines lazily: one result per line, in input order. Lines are read a decoding batch's worth at a time (`batch_tokens` source tokens or
        lines) and given back before more are read; from a file object with a descriptor
        (`sys.stdin`, a pipe) a batch also ends when no further line is waiting. The
        keywords are `translate`'s (but `target_prefix`), checked at the call.

        Raises:
            ConfigError: a bad setting (by its keyword) or an export's attention, at the call.
            TypeError: a str or bytes for lines, at the call; a line not a str, when reached.
        """
        check_iterable(lines)
        cfg = self._config(settings, nbest)  # a bad setting before any line
        return translate_windows(self._in_dtype(cfg), self.tokenizer, lines, cfg, self.device, nbest,
                                 return_scores or return_attention, return_attention,
                                 around=lambda: torch_threads(self.threads))

    @overload
    def score(self, sources: str, targets: str | list[str] | Translation, *, return_tokens: Literal[False] = False, **settings: Any) -> float: ...
    @overload
    def score(self, sources: str, targets: str | list[str] | Translation, *, return_tokens: Literal[True], **settings: Any) -> tuple[float, list[float]]: ...
    @overload
    def score(self, sources: Iterable[str], targets: Iterable[str | list[str] | Translation], *, return_tokens: Literal[False] = False, **settings: Any) -> list[float]: ...
    @overload
    def score(self, sources: Iterable[str], targets: Iterable[str | list[str] | Translation], *, return_tokens: Literal[True], **settings: Any) -> list[tuple[float, list[float]]]: ...

    def score(self, sources: str | Iterable[str],
              targets: str | list[str] | Translation | Iterable[str | list[str] | Translation],
              *, return_tokens: bool = False, **settings: Any) -> Any:
        """The model's score of each given translation, as the search scores its own
        (`scoring.score_lines`). A text is tokenised again; pieces (`Translation.tokens`)
        are scored as they are: the search's score for a line of one sentence; a
        `Translation` as its pieces, cut into the line's sentences and pieces where its
        `segments` say: the search's score for any line it was translated from.

        Args:
            sources: the Italian lines (or one str).
            targets: one per source (one with a str): a text, a list of pieces or a
                `Translation` (`translate(..., return_scores=True)`'s).
            return_tokens: give (score, token_scores) per line (`Translation.token_scores`).
            **settings: as for `translate`; `lenpen`, `split_sentences`, `batch_tokens`,
                `precision` apply, and for an export `min_len`.

        Returns a float per line (for a str, one float); with return_tokens (float, list).

        Raises:
            ConfigError: a bad setting. TypeError: lines that are not str. ValueError:
                unpaired lines, a target too long, a piece not in the vocabulary, a
                Translation of another line, a line to be scored whole (its text does
                not split as its source) longer than the model reads.
            CheckpointError: as for `translate`.
        """
        src, given, single = as_pairs(sources, targets, Translation)
        cfg, (tgt, segments) = self._config(settings, None), _unpacked(given)
        details: list | None = [] if return_tokens else None
        with as_arguments(), torch_threads(self.threads):
            scores = score_lines(self._in_dtype(cfg), self.tokenizer, src, tgt, cfg, self.device,
                                 details, segments)
        out = scores if details is None else list(zip(scores, details, strict=True))
        return out[0] if single else out

    def _config(self, settings: dict[str, Any], nbest: int | None) -> DecodeConfig:
        settings = settings if nbest is None else {**settings, "nbest": nbest}  # this call's
        if not settings:
            return self.decode  # the Translator's own, resolved once
        with as_arguments():  # this call's, checked (an error names the keyword) and resolved once
            return decode_settings(decode_config(self.decode, settings), self.device, self.model)

    def _in_dtype(self, cfg: DecodeConfig) -> Transformer | CT2Model:
        """The model in cfg's precision: the shared one (a call never changes it), or its
        copy in that dtype (`DtypeCopies`; the checkpoint's own weights where `load` rounded)."""
        return self.model if self._copies is None else self._copies.get(DTYPES[cfg.precision])

    def __repr__(self) -> str:
        return f"Translator({str(self.path)!r}, device={self.device}, precision={self.decode.precision})"


def _unpacked(targets: list[str | list[str] | Translation],
              ) -> tuple[list[str | list[str]], list[list[int] | None]]:
    """`score`'s targets as texts or pieces, and each one's segments: a Translation's
    pieces (its text where it has none) and segments, None for the others."""
    texts: list[str | list[str]] = []
    segments: list[list[int] | None] = []
    for t in targets:
        if isinstance(t, Translation) and t.tokens is not None:
            texts.append(t.tokens)
            segments.append(t.segments)
        else:
            texts.append(t.text if isinstance(t, Translation) else t)
            segments.append(None)
    return texts, segments


def _checkpoint_in(path: Path, held: Transformer, device: torch.device,
                   dtype: torch.dtype) -> Transformer:
    """The checkpoint's own weights in `dtype`, read again: those that `held`'s are a
    rounding of (a CTranslate2 user's expectation: the model read from disk is converted
    to the compute type asked for). CheckpointError, in one line naming the precision,
    where the checkpoint cannot be read or no longer holds them."""
    names = {d: name for name, d in DTYPES.items()}
    asked, kept = names[dtype], names.get(floating_dtype(held))
    try:
        found, _ = load_model(path, device)
    except CheckpointError as e:
        raise CheckpointError(f"precision={asked!r} decodes on the checkpoint's own weights, "
                              f"which this Translator holds in {kept}: {e}") from None
    if not rounds_to(found, held):
        raise CheckpointError(f"precision={asked!r}: {path} no longer holds the weights this "
                              f"Translator holds in {kept} (it changed since it was loaded): "
                              "load it again")
    return found.to(dtype)


def _check_threads(threads: Any) -> None:
    """None, or an int from 1 to the CPU's cores: a TypeError naming any other type ("2"
    failed in a comparison, 1.5 at the first call), else a ConfigError naming the bound."""
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool)):
        raise TypeError(f"threads={threads!r} is a {type(threads).__name__}, not an int (or None)")
    positive("threads", threads, optional=True)
    at_most_workers("threads", threads)


def _open(path: str | Path, device: str, precision: str, threads: int | None,
          settings: dict[str, Any], dtype: str = "auto",
          ) -> tuple[Transformer | CT2Model, Tokenizer, Path, torch.device, DecodeConfig, bool]:
    """`Translator.load`'s work: every argument checked before any is used, then the model
    read (no process-wide setting: the commands' `loading.load_for_inference` makes those).
    The last value: whether the weights are held rounded (in a dtype narrower than saved)."""
    if "nbest" in settings:
        raise ConfigError("nbest: give it to translate(), whose result it shapes")
    check_device("device", device)
    _check_threads(threads)
    decode = decode_config(DecodeConfig(), {**settings, "precision": precision})
    if dtype not in PRECISIONS:
        raise ConfigError(f"dtype={dtype!r}: choose one of {', '.join(PRECISIONS)}")
    where = check_path(path)  # all of the above before any work
    held = None  # the weights' dtype where `dtype` names one
    if is_export(where):
        if dtype != "auto":
            raise ConfigError(f"dtype={dtype}: an export computes in the type it was exported "
                              "with; leave dtype=auto")
        model, tokenizer, torch_device = load_export(where, device, threads)
    else:
        torch_device = resolve_device(device, key="device")
        held = resolve_precision(dtype, torch_device, key="dtype")[0] if dtype != "auto" else None
        model, tokenizer = load_model(where, torch_device)
    decode = decode_settings(decode, torch_device, model)  # once: the Translator keeps it
    rounded = False
    if not isinstance(model, CT2Model):  # the weights in the dtype the step computes in
        saved, target = floating_dtype(model), DTYPES[held or decode.precision]
        rounded = target not in (saved, torch.float32)  # only fp32 holds every other exactly
        model = model.to(target)
    return model, tokenizer, where, torch_device, decode, rounded
