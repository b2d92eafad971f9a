"""The `Translator`'s arguments: decode settings by name, checked as mt-translate checks
them, errors that name the Python argument, and what a call may change in the process.

    decode_config(DecodeConfig(), {"beam_size": 8})   # a checked DecodeConfig
    with as_arguments():                               # ConfigError("decode.beam_size=0: ...")
        ...                                            #   -> ConfigError("beam_size=0: ...")
    with torch_threads(4):                             # torch.set_num_threads(4), restored after
        ...

The checks are the commands' own (`DecodeConfig.validate`, `config.check_device`, ...),
which name `mt-translate`'s keys (`decode.beam_size`, `decode=beam`); a library call
names its keyword instead (`beam_size`, `method='beam'`): `as_arguments` rewrites the
message of a `ConfigError` that leaves a library call, so both faces share one set of
checks and their wording.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from omegaconf.errors import OmegaConfBaseException

from transformer.checkpoint import MODEL_CFG, CheckpointError, find_checkpoint
from transformer.config import ConfigError, DecodeConfig, omegaconf_error_line, to_dataclass
from transformer.decoding.ct2_model import EXPORT_INFO, is_export

# the keywords `load` and `translate` take; `max_tokens`, the old name of `batch_tokens`, too
SETTINGS = tuple(f.name for f in fields(DecodeConfig) if f.name != "max_tokens")

_METHOD = re.compile(r"\bdecode=(greedy|beam|sample)\b")  # mt-translate's preset: the method
_KEY = re.compile(r"\bdecode\.(\w+)")
_BARE = re.compile(r"\b(method|precision)=([A-Za-z]\w*)")  # a str value the message left unquoted


def argument_message(message: str) -> str:
    """A message naming mt-translate's keys, naming the Python keywords instead:
    `decode.method='beamm'` -> `method='beamm'`, `use decode=beam` -> `use method='beam'`."""
    message = _METHOD.sub(r"method='\1'", message)
    return _BARE.sub(r"\1='\2'", _KEY.sub(r"\1", message))


@contextlib.contextmanager
def as_arguments() -> Iterator[None]:
    """A `ConfigError` raised inside leaves with its message in keywords (`argument_message`)."""
    try:
        yield
    except ConfigError as e:
        e.args = (argument_message(str(e)), *e.args[1:])
        raise


_threads_lock = threading.Lock()
_threads_users = 0  # calls inside `torch_threads` with a thread count, in every Python thread
_threads_before = 0  # torch's setting when the first of them entered


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op threads set to `threads` inside, and what they were restored after
    the last call inside (from any Python thread) leaves.

    torch's setting holds for the whole process: other torch work running meanwhile (in
    another thread) runs with it too, and of calls that overlap with different counts the
    last to enter sets it. Overlapping calls count their entries, so the setting the
    first found is what the last restores (two calls restoring each other's value would
    leave the process with the wrong one). The count changes speed, never results'
    meaning. None leaves it alone.
    """
    global _threads_users, _threads_before
    if threads is None:
        yield
        return
    with _threads_lock:
        if not _threads_users:
            _threads_before = torch.get_num_threads()
        _threads_users += 1
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
    try:
        yield
    finally:
        with _threads_lock:
            _threads_users -= 1
            if not _threads_users and torch.get_num_threads() != _threads_before:
                torch.set_num_threads(_threads_before)


@dataclass
class _Settings:
    """mt-translate's `decode` group alone, so that errors name its keys (`decode.lenpen`)."""

    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def validate(self) -> None:
        self.decode.validate("decode")


def decode_config(base: DecodeConfig, settings: dict[str, Any]) -> DecodeConfig:
    """`base` with `settings` (DecodeConfig fields by name) in its place, checked as
    mt-translate checks its `decode.*` overrides: types, finite numbers, ranges.

    Args:
        base: the settings to start from.
        settings: DecodeConfig field names and values (`beam_size=8`, `method="greedy"`).

    Returns:
        A new, checked DecodeConfig (device-dependent defaults still `auto`/None:
        `settings.decode_settings` fills them in).

    Raises:
        ConfigError: an unknown name or a bad value; the message names mt-translate's key
            (`decode.beam_size=0: must be >= 1`; `as_arguments` turns it into the keyword).
    """
    unknown = [name for name in settings if name not in SETTINGS and name != "max_tokens"]
    if unknown:
        raise ConfigError(f"decode.{unknown[0]}: not a decode setting; the settings are "
                          f"{', '.join(SETTINGS)}")
    if "max_tokens" in settings:  # the old name replaces base's batch_tokens, as the new one would
        settings = {"batch_tokens": settings["max_tokens"], **settings}
    try:
        return to_dataclass(_Settings, {"decode": {**asdict(base), **settings}}).decode
    except OmegaConfBaseException as e:  # a value of the wrong type: one line naming the key
        raise ConfigError(omegaconf_error_line(e)) from None


def check_path(path: str | Path) -> Path:
    """`path` as a Path, if it is a checkpoint directory or an export, or the checkpoint a
    run directory names (its best, else its newest: `checkpoint.find_checkpoint`); else
    CheckpointError."""
    if not str(path):
        raise CheckpointError("no checkpoint given: Translator.load(path) takes a checkpoint "
                              "directory or a CTranslate2 export (mt-export)")
    where = Path(path).expanduser()
    if where.is_dir() and not (where / MODEL_CFG).is_file() and not is_export(where):
        where = find_checkpoint(where, key="path")  # a run directory: its best, else its newest
    if not where.is_dir():
        kind = "not a directory" if where.exists() else "no such directory"
        raise CheckpointError(f"{path}: {kind}; Translator.load takes a checkpoint directory "
                              "or a CTranslate2 export (mt-export)")
    if not is_export(where) and not (where / MODEL_CFG).is_file():
        raise CheckpointError(f"{path} is neither a checkpoint directory (it has no {MODEL_CFG}) "
                              f"nor a CTranslate2 export (no {EXPORT_INFO})")
    return where


def check_lines(lines: object, name: str = "lines") -> None:
    """Refuse bytes (an iterable of ints: decode them first), or anything that is neither a
    str nor an iterable, where lines of text belong."""
    if isinstance(lines, (bytes, bytearray, memoryview)):
        raise TypeError(f"{name} is {type(lines).__name__}, not str: decode it first "
                        f"({name}.decode('utf-8'))")
    if not isinstance(lines, (str, Iterable)):
        raise TypeError(f"{name} is a {type(lines).__name__}, not a str or an iterable of str")


def check_iterable(lines: object) -> None:
    """Refuse bytes or a single str where an iterable of lines belongs."""
    check_lines(lines)
    if isinstance(lines, str):
        raise TypeError("translate_iterable takes an iterable of lines; for one str use "
                        "translate(line)")


def as_lines(lines: object, name: str = "lines") -> tuple[list[str], bool]:
    """(the lines as a list, whether a single str was given); TypeError for bytes or for
    a line that is not a str (named: `lines[2]`)."""
    check_lines(lines, name)
    single = isinstance(lines, str)
    found = [lines] if single else list(lines)  # type: ignore[call-overload]
    for i, line in enumerate(found):
        if not isinstance(line, str):
            hint = ": decode it first" if isinstance(line, (bytes, bytearray, memoryview)) else ""
            raise TypeError(f"{name}[{i}] is a {type(line).__name__}, not a str{hint}")
    return found, single


def as_pairs(sources: object, targets: object, record: type | None = None,
             ) -> tuple[list[str], list[Any], bool]:
    """`Translator.score`'s arguments as two lists of as many entries, and whether a single
    str source was given; TypeError or ValueError naming what does not fit.

    A target is a text, a list of pieces, or a `record` (the Translator's `Translation`):
    with a single str source, `targets` is one of those; with a list of sources, a list of
    them, one per source.
    """
    whole = (str,) if record is None else (str, record)  # a target that is not a list
    src, single = as_lines(sources, "sources")
    if single:
        if not isinstance(targets, (*whole, list)):
            raise TypeError("give sources and targets both as a str (or a str and a list of "
                            "pieces, or a Translation), or both as lists")
        tgt: list = [targets]
    else:
        check_lines(targets, "targets")
        if isinstance(targets, str):
            raise TypeError("give sources and targets both as a str, or both as lists of str")
        tgt = list(targets)  # type: ignore[call-overload]
    for i, target in enumerate(tgt):
        pieces = isinstance(target, list) and all(isinstance(p, str) for p in target)
        if not isinstance(target, whole) and not pieces:
            hint = ": decode it first" if isinstance(target, (bytes, bytearray, memoryview)) else ""
            what = "list holding a non-str" if isinstance(target, list) else type(target).__name__
            also = f", a list of pieces (str) or a {record.__name__}" if record else \
                " or a list of pieces (str)"
            raise TypeError(f"targets[{i}] is a {what}, not a str{also}{hint}")
    if len(src) != len(tgt):
        raise ValueError(f"{len(src)} sources but {len(tgt)} targets: give one translation "
                         "per source line")
    return src, tgt, single
