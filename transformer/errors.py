"""The project's own error type: a user's mistake, as opposed to a bug.

Every error the project raises for something the user typed or gave it (a setting, a
file, a corpus, a checkpoint, an output path, a learning rate that diverges) derives
from `UserError`: the commands (`cli.run`) print its message as one line, `prog: error:
...`, and exit with status 1. Anything else, a ValueError or OSError raised by a bug
(ours, torch's, numpy's) included, keeps its traceback. A file the user names that cannot
be read or written is a `UserFileError`, raised where the project opens it (`file_error`),
so the message names the path and the key that gave it. Every writer runs inside
`writing`, which does the same for a full disk or another I/O error, whichever library
reports it (an OSError, safetensors' SafetensorError, torch.save's RuntimeError).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator


class UserError(Exception):
    """A mistake of the user's; the message says what, naming the key, file or line."""


class ConfigError(UserError, ValueError):
    """A setting outside its valid range; the message names the key."""


class UserFileError(UserError, OSError):
    """A file or folder the user named cannot be read or written (missing, a directory,
    no permission, a full disk); the message names it."""


def file_error(e: OSError, path: str | os.PathLike, doing: str, key: str | None = None) -> UserFileError:
    """`e` as one line naming `path` (and the setting `key` that named it): raise it `from e`.

    doing: what failed, e.g. "read", "write".
    """
    why = e.strerror or " ".join(str(e).split()) or type(e).__name__
    return UserFileError(f"{_where(path, key)}: cannot {doing} it ({why})")


def _where(path: str | os.PathLike, key: str | None) -> str:
    """The setting as typed: `key=path` (Hydra), `-o path` (argparse), or the path alone."""
    if not key:
        return str(path)
    return f"{key} {path}" if key.startswith("-") else f"{key}={path}"


# How the writers' libraries report an OSError they met: safetensors ("... (os error 28)"),
# Rust's Debug form ("Os { code: 28, ... }"), and torch.save, whose zip writer names no errno.
_ERRNO = re.compile(r"os error (\d+)|Os \{ code: (\d+)")
_TORCH_WRITE_FAILED = ("PytorchStreamWriter failed", "unexpected pos", "file write failed")


def write_failure(e: BaseException) -> str | None:
    """Why a write failed, in a few words, if `e` is an I/O failure of a writer (not a bug)."""
    if isinstance(e, OSError):
        return e.strerror or " ".join(str(e).split()) or type(e).__name__
    text = " ".join(str(e).split())
    if type(e).__name__ == "SafetensorError" or isinstance(e, RuntimeError):
        if m := _ERRNO.search(text):
            return os.strerror(int(m[1] or m[2]))
        if isinstance(e, RuntimeError) and any(s in text for s in _TORCH_WRITE_FAILED):
            return "the write failed: is the disk full?"
    return None


@contextlib.contextmanager
def writing(path: str | os.PathLike, key: str | None = None, doing: str = "write") -> Iterator[None]:
    """Run a write of `path`; a full disk or another I/O error becomes one line naming it
    (`UserFileError`, as `file_error` words it). The caller removes what was half written."""
    try:
        yield
    except UserError:
        raise
    except Exception as e:
        why = write_failure(e)
        if why is None:
            raise
        raise UserFileError(f"{_where(path, key)}: cannot {doing} it ({why})") from e
