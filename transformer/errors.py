"""The project's own error type: a user's mistake, as opposed to a bug.

Every error the project raises for something the user typed or gave it (a setting, a
file, a corpus, a checkpoint, an output path, a learning rate that diverges) derives
from `UserError`: the commands (`cli.run`) print its message as one line, `prog: error:
...`, and exit with status 1. Anything else, a ValueError or OSError raised by a bug
(ours, torch's, numpy's) included, keeps its traceback. A file the user names that cannot
be read or written is a `UserFileError`, raised where the project opens it (`file_error`),
so the message names the path and the key that gave it.
"""

from __future__ import annotations

import os


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
    where = f"{key}={path}" if key else str(path)
    return UserFileError(f"{where}: cannot {doing} it ({why})")
