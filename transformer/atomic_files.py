"""Writing a command's output so that a failure or Ctrl-C loses nothing.

`write_dir` and `write_file` write to a temporary sibling (`NAME.tmp-PID`, a name nothing
holds yet) that is renamed into place only when complete; an earlier output being replaced
is moved to a free `NAME.old-PID` first and deleted last, so a failure or Ctrl-C leaves it
whole, and no name the command did not make is ever removed. Each checks the output again
(`Output.recheck`: `outputs.check`, whose rules say what may be replaced) just before the rename, and marks
it as the command's (`.mt-output` in a directory, `.mt-outputs.json` beside a file).
`atomic_write` is for the files the package writes for itself, which no rule guards.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from transformer.errors import writing

if TYPE_CHECKING:
    from transformer.outputs import Output

DIR_MARKER = ".mt-output"  # inside a directory a command wrote: {"command", "time", "files"}
FILE_MARKERS = ".mt-outputs.json"  # in a folder: {file name: {"command": ..., "sha256": ...}}


@contextlib.contextmanager
def write_dir(out: Output) -> Iterator[Path]:
    """Yield a temporary sibling path (not yet made) to fill; when the block ends without
    an error, mark it as `out.command`'s and put it in place of `out.path`."""
    tmp = _free_sibling(out.path, f"{out.path.name}.tmp-{os.getpid()}")
    try:
        with writing(out.path, out.key):  # a full disk: one line naming the output
            _make_parents(out)
            yield tmp
            tmp.mkdir(exist_ok=True)
            marker = {"command": out.command, "time": _now(), "files": sorted(p.name for p in tmp.iterdir())}
            (tmp / DIR_MARKER).write_text(json.dumps(marker) + "\n")
            out.recheck()  # again: something may have appeared meanwhile
            _swap(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def write_file(out: Output) -> Iterator[Path]:
    """Yield a temporary sibling path (same suffix) to write; when the block ends without
    an error, record it in the folder's marker and put it in place of `out.path`."""
    tmp = _free_sibling(out.path, f".{out.path.stem}.tmp-{os.getpid()}", out.path.suffix)
    try:
        with writing(out.path, out.key):
            _make_parents(out)
            yield tmp
            out.recheck()
            # recorded before it is put in place: a marker that cannot be written (a full
            # disk) leaves no output behind that the next run would take for a user's file
            _record(out.path, {"command": out.command, "sha256": file_sha256(tmp)})
            _swap(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(out: Output, text: str) -> Path:
    """`text` (UTF-8) written to `out` as `write_file` does (a file that holds exactly
    `text` already is left as it is); returns the path."""
    if out.path.is_file() and not out.path.is_symlink() and file_sha256(out.path) == text_sha256(text):
        return out.path
    with write_file(out) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return out.path


def _free_sibling(path: Path, stem: str, suffix: str = "") -> Path:
    """A name beside `path` that nothing holds now: `stem+suffix`, else `stem.N+suffix`
    (a user's file that happens to bear the first name is never touched)."""
    candidate, n = path.with_name(stem + suffix), 1
    while candidate.exists() or candidate.is_symlink():
        candidate, n = path.with_name(f"{stem}.{n}{suffix}"), n + 1
    return candidate


def _make_parents(out: Output) -> None:
    out.path.parent.mkdir(parents=True, exist_ok=True)


def _swap(tmp: Path, out: Output) -> None:
    """Rename tmp to out.path; what was there (checked: ours, or empty) is moved aside first
    and deleted last."""
    old = _free_sibling(out.path, f"{out.path.name}.old-{os.getpid()}")
    if out.path.exists():
        out.path.rename(old)
    tmp.rename(out.path)
    if old.is_dir():
        shutil.rmtree(old, ignore_errors=True)
    else:
        old.unlink(missing_ok=True)


def _record(path: Path, entry: dict) -> None:
    """Note in the folder's marker that `path` is the command's; written atomically."""
    markers = path.parent / FILE_MARKERS
    known = read_json(markers)
    known[path.name] = entry
    tmp = _free_sibling(markers, f"{markers.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")
        tmp.replace(markers)
    finally:
        tmp.unlink(missing_ok=True)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def atomic_write(path: Path, data: bytes) -> None:
    """Write via a temporary file and rename, so concurrent ranks never read half a file.

    For the files the package writes for itself (a tokenizer model, the prepared-data
    cache's notes), which `check` does not guard; a command's outputs go by `write_file`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> dict:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):  # none, unreadable or damaged: nothing is known to be ours
        return {}
    return found if isinstance(found, dict) else {}


def file_sha256(path: Path) -> str | None:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
