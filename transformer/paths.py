"""Where a path the user typed resolves: against the working directory, or the project.

Two rules, one per kind of path, and every layer uses them:
- **the user's own files** (a corpus file, a test set, a checkpoint to translate with, an
  output; the `data.*` keys in `USER_PATH_KEYS`) resolve against the working directory,
  as for every command-line tool: `user_path`;
- **the project's own folders** (`data.root` where the shared corpora lie, `data.cache_dir`
  where prepared data is kept, the sample corpus) resolve against the project root,
  wherever the command runs: `project_path`. Hydra's configs are in `CONFIG_DIR`.
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent  # data.root and data.cache_dir resolve here
CONFIG_DIR = PROJECT_ROOT / "configs"

# The DataConfig keys that name the user's own files (resolved with `user_path`).
USER_PATH_KEYS = ("train_src", "train_tgt", "dev_src", "dev_tgt", "hub_local_dir", "tokenizer")


def project_path(path: str | os.PathLike) -> Path:
    """A path to the project's own folders (`data.root`, `data.cache_dir`, the sample
    corpus): relative, it is under the project root, wherever the command runs."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else PROJECT_ROOT / path


def user_path(path: str | os.PathLike) -> Path:
    """A path the user names (a corpus file, a local hub mirror, a test set): relative, it
    is under the working directory, as for every command-line tool."""
    return Path(path).expanduser().absolute()
