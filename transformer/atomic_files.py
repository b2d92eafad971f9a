"""Writing a file or a folder so that a failure or Ctrl-C loses nothing: one mechanism.

`put_in_place(path)` yields a temporary sibling (`NAME.tmp-PID`, or another name nothing
holds yet) for the caller to fill; when the block ends without an error, an earlier
folder at `path` is moved aside to a free `NAME.old-PID`, the sibling is renamed to
`path`, and what was moved aside is deleted last (a file is replaced by one rename, which
is atomic). A failure anywhere leaves the earlier `path` whole and removes the sibling; a
failure of the final rename puts back what was moved aside; no name the writer did not
make is ever removed. A crash between the renames leaves `NAME.old-PID` and the complete
`NAME.tmp-PID` behind (`checkpoint.recover_interrupted_writes` finishes such a swap in a
run's checkpoints folder).

Its users: the commands' outputs (`outputs.write_dir`, `write_file`, which add the output
rules and markers), the checkpoint writer (`checkpoint.save_checkpoint`), the
prepared-data cache's folders and `atomic_write`, for the files the package writes for
itself (a tokenizer model, the cache's notes). Everything is made as the user's umask
says, as any file a program writes: a cache or a checkpoint shared with a serving
account is readable by it when the umask allows (`follow_umask` for what a library
writes owner-only).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def put_in_place(path: Path, stem: str | None = None, suffix: str = "",
                 replace: bool | Callable[[Path], bool] = True) -> Iterator[Path]:
    """Yield a temporary sibling path of `path` (not yet made) to fill, as a file or a
    folder; when the block ends without an error, it becomes `path` (module docstring).

    Args:
        path: what is written.
        stem, suffix: the sibling's name, `stem + suffix` (default `NAME.tmp-PID`); a name
            already taken gets `.1`, `.2`... before the suffix (`free_sibling`).
        replace: whether an existing `path` is replaced, or a test of it (the cache keeps
            a complete folder another process put there first, and drops its own copy).
    """
    tmp = free_sibling(path, stem or f"{path.name}.tmp-{os.getpid()}", suffix)
    try:
        yield tmp
        if not (tmp.exists() or tmp.is_symlink()):
            raise FileNotFoundError(f"{tmp}: the writer made nothing to put in place")
        keep = path.exists() and not (replace(path) if callable(replace) else replace)
        if not keep:
            _swap(tmp, path)
    finally:
        _remove(tmp)


def _swap(tmp: Path, path: Path) -> None:
    """`tmp` renamed to `path`: a file by one atomic rename; a folder (which a rename
    cannot replace) after moving what is there aside, which goes back if the rename fails."""
    if not (tmp.is_dir() or path.is_dir()):
        os.replace(tmp, path)
        return
    if not (path.exists() or path.is_symlink()):
        tmp.rename(path)
        return
    old = free_sibling(path, f"{path.name}.old-{os.getpid()}")
    path.rename(old)
    try:
        tmp.rename(path)
    except BaseException:
        if not path.exists():
            old.rename(path)  # the previous copy goes back
        raise
    _remove(old)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def free_sibling(path: Path, stem: str, suffix: str = "") -> Path:
    """A name beside `path` that nothing holds now: `stem+suffix`, else `stem.N+suffix`
    (a user's file that happens to bear the first name is never touched)."""
    candidate, n = path.with_name(stem + suffix), 1
    while candidate.exists() or candidate.is_symlink():
        candidate, n = path.with_name(f"{stem}.{n}{suffix}"), n + 1
    return candidate


def atomic_write(path: Path, data: bytes) -> None:
    """`data` written to `path` by `put_in_place` (a hidden `.NAME.tmp-PID` renamed into
    place): a reader sees the old file or the new one, never half of one; its parents
    are made. For the files the package writes for itself, which no output rule guards;
    a command's outputs go by `outputs.write_file`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with put_in_place(path, f".{path.name}.tmp-{os.getpid()}") as tmp:
        tmp.write_bytes(data)


def umask() -> int:
    """This process's umask, read without changing it where the system says it (Linux's
    /proc); elsewhere set and restored at once."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(path: Path) -> None:
    """Give `path` the mode a file (or folder) made by `open` (or `mkdir`) gets: a library
    that writes through its own temporary file (safetensors does) leaves it owner-only."""
    full = 0o777 if path.is_dir() else 0o666
    os.chmod(path, full & ~umask())


def read_json(path: Path) -> dict:
    """A JSON object from `path`; {} for none, an unreadable one or another JSON value."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):  # none, unreadable or damaged: nothing is known to be ours
        return {}
    return found if isinstance(found, dict) else {}


def file_sha256(path: Path) -> str | None:
    """The file's SHA-256 (hex); None if it cannot be read."""
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
