"""Translating a stream of lines lazily: read a batch's worth, translate it, give it back.

    for hyps in iter_nbest(model, tokenizer, open("news.it"), DecodeConfig()):
        print(hyps[0][0])                                  # each line's best translation

`text.translate_nbest` takes a list, whole: a million-line generator would be read (and
held) before its first line is translated. `iter_nbest` reads lines into a window until
it holds one decoding batch's worth of source tokens (decode.batch_tokens: 2,000 on a CPU;
on CUDA 8,000 doubled while half the free memory holds the worst batch, at most 64,000; at
most that many lines, however short, and at most WINDOW_LINES), each line split into
sentences and encoded as it is read; translates the window's sentences with
`translate_nbest` (which sorts them by length and batches them, as for a whole file), and
yields the window's n-best lists in input order before it reads on. Memory is bounded by
the window, whatever the input's length.

An interactive input (a terminal, a pipe that a person or a server writes into) should
not wait for a full window: given `ready` (`input_ready(stdin)`: whether the input has a
line waiting), a window is also closed when nothing more is waiting, so a line typed
into `mt-translate` is translated at once. A file or a fast pipe always has more
waiting: its windows stay full.
"""

from __future__ import annotations

import contextlib
import select
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from transformer.config import DecodeConfig
from transformer.data.corpus import normalize
from transformer.data.sentences import Segments, segment
from transformer.data.tokenizer import Tokenizer
from transformer.decoding.ct2_model import CT2Model
from transformer.decoding.settings import decode_settings
from transformer.decoding.text import translate_nbest

NBest = list[tuple[str, float]]


def input_ready(source: object) -> Callable[[], bool] | None:
    """For a file object with a file descriptor (stdin, a pipe, a socket's file): a
    function that says, without blocking, whether it has input waiting; else None.

    A regular file is always ready. Text buffered inside Python but no longer in the
    descriptor reads as not ready: the window closes early, nothing is lost.
    """
    try:
        fd = source.fileno()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):  # a list, a generator, io.StringIO
        return None

    def ready() -> bool:
        try:
            return bool(select.select([fd], [], [], 0)[0])
        except (OSError, ValueError):  # closed, or a descriptor select cannot take
            return True

    return ready


# At most this many lines a window, whatever batch_tokens allows (131,072 tokens of short
# lines was 118,160 lines read, and nothing yielded, from an endless input): the first
# results come after a bounded read, and a window still fills several decoding batches.
WINDOW_LINES = 1024


@dataclass
class Window:
    """A run of input lines, and the same lines split into sentences and encoded
    (`sentences.segment`): what `text.translate_nbest` decodes, encoded once."""

    lines: list[str] = field(default_factory=list)
    segments: Segments = field(default_factory=lambda: Segments(n_lines=0))


def windows(lines: Iterable[str], tokenizer: Tokenizer, batch_tokens: int,
            ready: Callable[[], bool] | None = None, *, max_len: int,
            split: bool = True) -> Iterator[Window]:
    """Consecutive runs of `lines`, each closed once it holds `batch_tokens` source tokens
    or lines, WINDOW_LINES lines, or (with `ready`) when no further line is waiting.

    Each line is split into sentences (if `split`) and encoded as it is read, its units
    cut to `max_len` ids (the model's max_positions): its tokens are those of its units,
    and the window hands them on (`Window.segments`), so no line is encoded twice.

    Raises:
        TypeError: a line that is not a str (named by its index: `lines[3]`).
    """
    window = Window()
    tokens = 0
    for n, line in enumerate(lines, start=1):
        if not isinstance(line, str):
            raise TypeError(f"lines[{n - 1}] is a {type(line).__name__}, not a str")
        units = segment([line], tokenizer, max_len, split)
        window.lines.append(line)
        window.segments.extend(units)
        tokens += sum(map(len, units.ids))
        if (tokens >= batch_tokens or len(window.lines) >= min(batch_tokens, WINDOW_LINES)
                or (ready is not None and not ready())):
            yield window
            window, tokens = Window(), 0
    if window.lines:
        yield window


def iter_nbest(
    model,
    tokenizer: Tokenizer,
    lines: Iterable[str],
    cfg: DecodeConfig,
    device: torch.device | str | None = None,
    *,
    ready: Callable[[], bool] | None = None,
    around: Callable[[], contextlib.AbstractContextManager] | None = None,
    progress: bool = False,
    counts: dict[str, int] | None = None,
    prefixes: Iterator[str | None] | None = None,
) -> Iterator[NBest]:
    """Each line's n-best list of (text, score), in input order, as `text.translate_nbest`
    gives it, a window at a time (module docstring).

    The settings are checked against the model and device when this is called, before
    any line is read (`settings.decode_settings`).

    Args:
        model (Transformer | CT2Model): the model, or an export's `CT2Model`.
        tokenizer: the model's SentencePiece tokenizer.
        lines: any iterable of str; read a window at a time.
        cfg: the decode settings.
        device: where the model is; None: where its weights are.
        ready: whether the input has a line waiting (`input_ready`); None: windows are
            always filled.
        around: a context each window's translation runs in (the Translator's thread
            count), left before the window's lines are yielded.
        progress: a tqdm bar on stderr counting lines.
        counts: if given, receives the running numbers of `lines`, `sentences` and `units`.
        prefixes: None, or a target prefix (a text, or None) per line, read in step with
            the lines (mt-translate's input.target_prefix_file).

    Raises:
        ConfigError: settings the model or device cannot run, named by their key.
        TypeError: a line that is not a str.
    """
    model = getattr(model, "module", model)
    if device is None:
        device = model.device if isinstance(model, CT2Model) else next(model.parameters()).device
    device = torch.device(device)
    cfg = decode_settings(cfg, device, model)  # eager: a bad setting before the first line
    return _iterate(model, tokenizer, lines, cfg, device, ready, around, progress, counts, prefixes)


def _iterate(model, tokenizer, lines, cfg, device, ready, around, progress, counts,
             prefixes=None) -> Iterator[NBest]:
    bar = tqdm(unit="line", file=sys.stderr, disable=not progress)
    done = 0
    try:
        for window in windows(lines, tokenizer, cfg.batch_tokens, ready,
                              max_len=model.cfg.max_positions, split=cfg.split_sentences):
            found: dict[str, int] = {}
            prefix = None if prefixes is None else [
                tokenizer.encode([normalize(p)])[0] if (p := next(prefixes, None)) else None
                for _ in window.lines]
            with around() if around is not None else contextlib.nullcontext():
                nbest = translate_nbest(model, tokenizer, window.lines, cfg, device, counts=found,
                                        first_line=done + 1, prefixes=prefix,
                                        segments=window.segments)
            done += len(window.lines)
            if counts is not None:
                for key, value in found.items():
                    counts[key] = counts.get(key, 0) + value
            bar.update(len(window.lines))
            yield from nbest
    finally:
        bar.close()
