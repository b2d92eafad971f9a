"""`Translator`: the package's Python face, text in and text out, as `mt-translate` does it.

    from transformer import Translator

    translator = Translator.load("runs/tatoeba_cpu/checkpoints/best")  # or an mt-export directory
    translator.translate(["Ciao, come stai?", "Che ore sono?"])         # ["Hi, how are you?", ...]
    translator.translate(lines, method="greedy", max_len_b=20)          # any decode.* setting
    translator.translate(lines, nbest=3, return_scores=True)            # [[Translation(text, score), ...], ...]
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

Nothing here changes the process: `threads` holds for the translator's own calls only
(`arguments.torch_threads`), and glibc's allocator is left as it is (the `mt-*`
commands, which own their process, tune it: `device.keep_large_blocks_in_the_heap`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, overload

import torch

from transformer.checkpoint import load_model
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
from transformer.decoding.stream import input_ready, iter_nbest
from transformer.decoding.text import decode_settings, translate_nbest
from transformer.device import resolve_device
from transformer.model.transformer import Transformer

__all__ = ["SETTINGS", "Translation", "Translator", "decode_config"]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Translation:
    """A translation and its score: the search's own, the sum of the log-probabilities of
    its tokens and EOS over GNMT's length penalty ((5 + |y|) / 6) ** lenpen; for a line of
    several sentences, the sum of its sentences' scores. `Translator.score` gives the same
    number for the same text."""

    text: str
    score: float


class Translator:
    """A model and its tokenizer, ready to translate lines of Italian into English.

    Build one with `Translator.load(path)`. `model` is a `Transformer` or an export's
    `ct2_model.CT2Model`; `tokenizer` its SentencePiece model; `device` where it runs;
    `decode` the settings `translate` starts from; `threads` torch's threads during its
    calls (None: torch's setting as it is). Several Python threads may share one
    Translator if they share its `threads`: torch's thread count is the process's.
    """

    def __init__(self, model: Transformer | CT2Model, tokenizer: Tokenizer, *,
                 device: torch.device | str | None = None, decode: DecodeConfig | None = None,
                 path: Path | None = None, threads: int | None = None) -> None:
        """A Translator for a `Transformer` or `CT2Model` already in memory on `device`
        (None: where its weights are), with its tokenizer; `decode`: the settings
        `translate` starts from (checked here); `path`: where it came from (for `repr`);
        `threads`: torch's threads during its calls (not an export's: `load` sets those)."""
        model = getattr(model, "module", model)  # DistributedDataParallel wraps the model
        if device is None:
            device = model.device if isinstance(model, CT2Model) else next(model.parameters()).device
        with as_arguments():
            _check_threads(threads)
            self.decode = decode_config(DecodeConfig() if decode is None else decode, {})
        self.model, self.tokenizer, self.device, self.path = model, tokenizer, torch.device(device), path
        self.threads = None if isinstance(model, CT2Model) else threads

    @classmethod
    def load(cls, path: str | Path, *, device: str | torch.device = "auto", precision: str = "auto",
             threads: int | None = None, **settings: Any) -> Translator:
        """Load a checkpoint directory or a CTranslate2 export (`mt-export`).

        Args:
            path: a checkpoint directory (`model.safetensors`, `model.json`, ...) or an
                export directory (`export.json` beside CTranslate2's files).
            device: `auto` (CUDA where there is a GPU, else the CPU), `cpu`, `cuda` or
                `cuda:N` (or a `torch.device`): mt-translate's `device`.
            precision: `auto` (bf16 on a GPU that has it, else fp16; bf16 on a CPU with
                native bf16, else fp32), `fp32`, `bf16` or `fp16` (CUDA only). An export
                computes in the type it was exported with and takes only `auto`.
            threads: CPU threads. A checkpoint: torch's, set for each of the translator's
                calls and restored after it (None: torch's setting as it is). An export:
                CTranslate2's workers, its own (None: 2). mt-translate's `threads`.
            **settings: defaults for `translate`, by `DecodeConfig` field name
                (`method="greedy"`, `beam_size=8`, ...; `nbest` is `translate`'s alone).

        Raises:
            CheckpointError: `path` is not a checkpoint directory or an export, or is
                incomplete or corrupt (the message names the path).
            ConfigError: a bad device, thread count or setting (the message names the
                keyword), or an export that needs ctranslate2 (`pip install -e ".[ct2]"`).
        """
        with as_arguments():
            model, tokenizer, where, torch_device, decode = _open(path, str(device), precision,
                                                                 threads, settings)
        return cls(model, tokenizer, device=torch_device, decode=decode, path=where, threads=threads)

    # a str gives one result, an iterable a list; nbest: a list each; return_scores: Translations
    @overload
    def translate(self, lines: str, *, nbest: None = None, return_scores: Literal[False] = False,
                  **settings: Any) -> str: ...
    @overload
    def translate(self, lines: str, *, nbest: int, return_scores: Literal[False] = False,
                  **settings: Any) -> list[str]: ...
    @overload
    def translate(self, lines: str, *, nbest: None = None, return_scores: Literal[True],
                  **settings: Any) -> Translation: ...
    @overload
    def translate(self, lines: str, *, nbest: int, return_scores: Literal[True],
                  **settings: Any) -> list[Translation]: ...
    @overload
    def translate(self, lines: Iterable[str], *, nbest: None = None,
                  return_scores: Literal[False] = False, **settings: Any) -> list[str]: ...
    @overload
    def translate(self, lines: Iterable[str], *, nbest: int, return_scores: Literal[False] = False,
                  **settings: Any) -> list[list[str]]: ...
    @overload
    def translate(self, lines: Iterable[str], *, nbest: None = None, return_scores: Literal[True],
                  **settings: Any) -> list[Translation]: ...
    @overload
    def translate(self, lines: Iterable[str], *, nbest: int, return_scores: Literal[True],
                  **settings: Any) -> list[list[Translation]]: ...

    def translate(self, lines: str | Iterable[str], *, nbest: int | None = None,
                  return_scores: bool = False, **settings: Any) -> Any:
        """Translate lines, as `mt-translate` translates the lines of a file.

        Each line is normalised and split into sentences, translated together (batched by
        length) and joined again: one result per line, in input order; an empty line
        gives "". All lines are read first (`translate_iterable` reads a batch at a time).

        Args:
            lines: the Italian lines; a single string is one line.
            nbest: None: each line's best translation. k: each line's k best, best first,
                as a list (mt-translate's `decode.nbest`; needs `method="beam"` and
                k <= beam_size; an empty line gives [""]).
            return_scores: give `Translation(text, score)`s instead of strings: the
                search's length-normalised score; for a line of several sentences, the sum
                of theirs (n-best: the k-th entry joins the sentences' k-th hypotheses).
                An empty line scores 0.0.
            **settings: this call's decode settings, by `DecodeConfig` field name
                (`method`, `beam_size`, `lenpen`, `max_len_a`, `max_len_b`, `min_len`,
                `max_tokens`, `precision`, `split_sentences`); the others are the
                Translator's (`load`'s, else beam 5, lenpen 0.6).

        Returns:
            One result per line (for a single str, its result): a str, a `Translation`
            with `return_scores`, and with `nbest` a list of those.

        Raises:
            ConfigError: a bad setting (the message names the keyword, e.g. `beam_size=0`).
            TypeError: a line that is not a str, or bytes given for lines.
        """
        batch, single = as_lines(lines)
        cfg = self._config(settings, nbest)
        with as_arguments(), torch_threads(self.threads):
            found = translate_nbest(self.model, self.tokenizer, batch, cfg, self.device)
        out = [_shaped(hyps, nbest, return_scores) for hyps in found]
        return out[0] if single else out

    @overload
    def translate_iterable(self, lines: Iterable[str], *, nbest: None = None,
                           return_scores: Literal[False] = False, **settings: Any) -> Iterator[str]: ...
    @overload
    def translate_iterable(self, lines: Iterable[str], *, nbest: int,
                           return_scores: Literal[False] = False, **settings: Any) -> Iterator[list[str]]: ...
    @overload
    def translate_iterable(self, lines: Iterable[str], *, nbest: None = None,
                           return_scores: Literal[True], **settings: Any) -> Iterator[Translation]: ...
    @overload
    def translate_iterable(self, lines: Iterable[str], *, nbest: int, return_scores: Literal[True],
                           **settings: Any) -> Iterator[list[Translation]]: ...

    def translate_iterable(self, lines: Iterable[str], *, nbest: int | None = None,
                           return_scores: bool = False, **settings: Any) -> Iterator[Any]:
        """Translate any iterable of lines lazily: one result per line, in input order.

        Lines are read a decoding batch's worth at a time (`max_tokens` source tokens, at
        most that many lines), translated as `translate` translates them and given back
        before more are read: a million-line generator is never held whole. From a file
        object with a descriptor (`sys.stdin`, a pipe), a batch also ends when no further
        line is waiting: an interactive input gets each line back at once. `nbest`,
        `return_scores` and the settings are `translate`'s, checked at the call.

        Raises:
            ConfigError: a bad setting, at the call (named by its keyword).
            TypeError: a str or bytes for lines, at the call; a line that is not a str,
                when the iterator reaches it.
        """
        check_iterable(lines)
        cfg = self._config(settings, nbest)
        with as_arguments():
            found = iter_nbest(self.model, self.tokenizer, lines, cfg, self.device,
                               ready=input_ready(lines), around=lambda: torch_threads(self.threads))
        return _results(found, nbest, return_scores)

    @overload
    def score(self, sources: str, targets: str, **settings: Any) -> float: ...
    @overload
    def score(self, sources: Iterable[str], targets: Iterable[str], **settings: Any) -> list[float]: ...

    def score(self, sources: str | Iterable[str], targets: str | Iterable[str],
              **settings: Any) -> float | list[float]:
        """The model's score of each given translation, as the search scores its own:
        `translate(line, return_scores=True).score` for the text it gave back.

        The log-probabilities of its tokens and EOS (teacher forcing), summed, over
        ((5 + |y|) / 6) ** lenpen; a line's translation is split by the sentence splitter
        and each part scored against the source's sentence, the scores summed (a line
        whose parts do not match its sentences in number is scored whole, with a
        warning). The text is tokenised again: a text `translate` gave back scores as its
        search scored it when SentencePiece encodes it to the pieces the search chose.

        Args:
            sources: the Italian lines (or one str).
            targets: their translations, one per source (a str with a str).
            **settings: as for `translate`; `lenpen`, `split_sentences`, `max_tokens`,
                `precision` apply, and for an export `min_len` (module docstring).

        Returns:
            A float per line (for a str, one float).

        Raises:
            ConfigError: a bad setting. TypeError: lines that are not str.
            ValueError: sources and targets of different lengths, or a translation longer
                than the model writes.
        """
        src, tgt, single = as_pairs(sources, targets)
        cfg = self._config(settings, None)
        with as_arguments(), torch_threads(self.threads):
            cfg = decode_settings(cfg, self.device, self.model)
            scores = score_lines(self.model, self.tokenizer, src, tgt, cfg, self.device)
        return scores[0] if single else scores

    def _config(self, settings: dict[str, Any], nbest: int | None) -> DecodeConfig:
        with as_arguments():  # this call's settings, checked (a ConfigError names the keyword)
            return decode_config(self.decode, settings if nbest is None else {**settings, "nbest": nbest})

    def __repr__(self) -> str:
        return (f"Translator({str(self.path)!r}, device={self.device}, "
                f"precision={self.decode.precision})")


def _check_threads(threads: Any) -> None:
    """`threads` is None or an int >= 1: "2" failed in a comparison, 1.5 at the first call."""
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool)):
        raise TypeError(f"threads={threads!r} is a {type(threads).__name__}, not an int (or None)")
    positive("threads", threads, optional=True)


def _open(path: str | Path, device: str, precision: str, threads: int | None,
          settings: dict[str, Any]) -> tuple[Transformer | CT2Model, Tokenizer, Path, torch.device, DecodeConfig]:
    """`Translator.load`'s work: every argument checked before any is used, then the model
    read (no process-wide setting: the commands' `text.load_for_inference` makes those)."""
    if "nbest" in settings:
        raise ConfigError("nbest: give it to translate(), whose result it shapes")
    check_device("device", device)
    _check_threads(threads)
    at_most_workers("threads", threads)
    decode = decode_config(DecodeConfig(), {**settings, "precision": precision})
    where = check_path(path)  # all of the above before any work
    if is_export(where):
        model, tokenizer, torch_device = load_export(where, device, threads)
    else:
        torch_device = resolve_device(device, key="device")
        model, tokenizer = load_model(where, torch_device)
    decode_settings(decode, torch_device, model)  # what depends on the device and the model
    if torch_device.type == "cpu" and not isinstance(model, CT2Model):
        _warn_if_spinning(threads or torch.get_num_threads())
    return model, tokenizer, where, torch_device, decode


_warned_spinning = False


def _warn_if_spinning(threads: int) -> None:
    """A warning where OpenMP's threads will spin against other work: a busy machine and
    no OMP_WAIT_POLICY (the mt-* commands set PASSIVE; a library leaves the process alone)."""
    try:
        load, cores = os.getloadavg()[0], os.cpu_count() or 1
    except (OSError, AttributeError):  # no load average on this OS
        return
    global _warned_spinning
    if threads > 1 and "OMP_WAIT_POLICY" not in os.environ and load > cores and not _warned_spinning:
        _warned_spinning = True  # once a process: the load is the machine's, not a Translator's
        log.warning("this machine is busy (load %.1f on %d cores) and OpenMP's threads spin "
                    "while they wait: set OMP_WAIT_POLICY=PASSIVE before importing torch "
                    "(greedy decoding ran 7x faster with it on a loaded 2-core CPU; "
                    "docs/decoding.md, 'Nothing process-wide')", load, cores)


def _results(found: Iterator[list[tuple[str, float]]], nbest: int | None,
             scores: bool) -> Iterator[Any]:
    with as_arguments():  # errors raised while the lines are read and translated
        for hyps in found:
            yield _shaped(hyps, nbest, scores)


def _shaped(hyps: list[tuple[str, float]], nbest: int | None, scores: bool) -> Any:
    """A line's n-best list as `translate` returns it."""
    if nbest is None:
        return Translation(*hyps[0]) if scores else hyps[0][0]
    return [Translation(*h) for h in hyps] if scores else [text for text, _ in hyps]
