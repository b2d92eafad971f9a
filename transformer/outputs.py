"""One rule for every output a command writes: nothing a user owns is ever overwritten.

The outputs: an average's checkpoint directory (mt-average), an export or an Argos
package (mt-export), a translation (mt-translate), an evaluation's files (mt-evaluate), a
picture (mt-masks).
(Training's run directory has its own rules, `training/run_dir.py`; the prepared-data cache is a
folder of entries named by their content, checked by `check_folder`.) Each command calls
`check` on each of its outputs before any work starts, and it refuses, in one line
naming the key the user typed:
- a path that holds something, unless `force=true` and the same command wrote it, as its
  marker says: `.mt-output` inside a directory it wrote, listing the files it wrote there
  (a file it does not list is someone else's, and a marker that lists none licenses
  nothing); for a file, an entry in the folder's `.mt-outputs.json` with the file's
  SHA-256, so a file the user changed since is theirs again. An empty directory holds
  nothing and may be written;
- an output equal to, inside, or a parent of one of the command's inputs;
- a run directory (`checkpoints/`, `train.log`, a `.lock`) or a run's checkpoints folder,
  or a path inside one (mt-train would refuse to resume a run holding files it did not
  write), but for a checkpoint (mt-average's) put directly in a run's checkpoints folder
  under a name mt-train neither writes (`best`, `step_N`) nor tidies (`NAME.tmp-N`, `NAME.old-N`);
- a path under a file, or under a folder that cannot be written.
Then the command writes the output with `write_dir`, `write_file` or `write_text`, which
check it again just before it is put in place (`Output.recheck`: something may have
appeared meanwhile), mark it as the command's (`.mt-output` in a directory,
`.mt-outputs.json` beside a file) and put it in place by `atomic_files.put_in_place`: a
failure or Ctrl-C leaves the earlier output whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from transformer.atomic_files import atomic_write, file_sha256, put_in_place, read_json, text_sha256
from transformer.config import ConfigError
from transformer.errors import UserError, writing

DIR_MARKER = ".mt-output"  # inside a directory a command wrote: {"command", "time", "files"}
FILE_MARKERS = ".mt-outputs.json"  # in a folder: {file name: {"command": ..., "sha256": ...}}

# The names mt-train gives in a run's checkpoints folder: `step_N` (and `best`), and while
# writing one, `NAME.tmp-PID` and `NAME.old-PID`, which a resume tidies (checkpoint.py)
STEP_DIR = re.compile(r"^step_(\d+)$")
LEFTOVER = re.compile(r"^(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)$")


class OutputError(UserError):
    """An output that may not be written where the user asked; the message names the key.

    A `UserError` (one line from the commands), not a `ConfigError`: the setting is valid,
    the place it names is taken."""


@dataclass(frozen=True)
class Output:
    """One output of a command: where, which setting named it, whether it is a directory.

    key and value: the setting as the user typed it (`output`, `-o`, `output_dir`), for
    messages; path: the output itself (for mt-evaluate, a file under output_dir).
    owned_before: recognises outputs this command wrote before markers existed.
    checkpoint: the output is a checkpoint directory (mt-average), which may go into a
    run's checkpoints folder beside the run's own (`-o runs/x/checkpoints/avg5`).
    """

    path: Path
    key: str
    value: str
    command: str
    is_dir: bool = False
    force: bool = False
    owned_before: Callable[[Path], bool] | None = None
    checkpoint: bool = False

    @classmethod
    def of(cls, value: str | os.PathLike, key: str, command: str, **kw) -> Output:
        return cls(Path(value), key, str(value), command, **kw)

    @property
    def force_flag(self) -> str:
        """How the user asks to replace: `--force` (argparse) or `force=true` (Hydra)."""
        return "--force" if self.key.startswith("-") else "force=true"

    def recheck(self) -> None:
        """`check` again, inputs aside: what the writers (`write_dir`, `write_file`) do just before
        they put the output in place, as something may have appeared meanwhile."""
        check(self)

    def refuse(self, why: str) -> OutputError:
        setting = f"{self.key} {self.value}" if self.key.startswith("-") else f"{self.key}={self.value}"
        shown = "" if str(self.path) in (self.value, ".") else f"{self.path} "
        return OutputError(f"{setting}: {shown}{why}")


def check(out: Output, inputs: Iterable[str | os.PathLike | None] = (), same_as: str | None = None) -> None:
    """Refuse `out` (OutputError) if writing it could lose anything; see the module's rules.

    same_as: the text a file output will hold, if known: a file that holds exactly that
    already loses nothing (`write_text` leaves it as it is).
    """
    if not out.value.strip():  # Path("") is ".", the working directory
        raise out.refuse(f"empty: name a {'directory' if out.is_dir else 'file'}")
    check_place(out, inputs)
    if not out.path.exists() and not out.path.is_symlink():
        return
    if out.path.is_symlink():
        raise out.refuse("is a symbolic link: not replacing it")
    if out.is_dir and out.path.is_dir() and not any(out.path.iterdir()):
        return  # an empty directory holds nothing to lose
    if same_as is not None and out.path.is_file() and file_sha256(out.path) == text_sha256(same_as):
        return  # it holds what would be written: nothing to lose
    kind = "directory" if out.is_dir else "file"
    if out.is_dir != out.path.is_dir():
        raise out.refuse(f"exists and is not a {kind}: not replacing it")
    strangers = _foreign_entries(out) if out.is_dir else []
    if strangers:
        raise out.refuse(f"holds files {out.command} did not write ({_listed(strangers)}): not "
                         f"replacing it, even with {out.force_flag}")
    if not owned(out):
        raise out.refuse(f"exists and is not an output of {out.command} (it has no "
                         f"{_marker_name(out)}): not replacing it, even with {out.force_flag}")
    if not out.force:
        raise out.refuse(f"exists (an earlier output of {out.command}): add {out.force_flag} "
                         "to replace it")


@contextlib.contextmanager
def write_dir(out: Output) -> Iterator[Path]:
    """Yield a temporary sibling path (not yet made) to fill; when the block ends without
    an error, mark it as `out.command`'s and put it in place of `out.path`."""
    with writing(out.path, out.key):  # a full disk: one line naming the output
        out.path.parent.mkdir(parents=True, exist_ok=True)
        with put_in_place(out.path) as tmp:
            yield tmp
            tmp.mkdir(exist_ok=True)
            marker = {"command": out.command, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                      "files": sorted(p.name for p in tmp.iterdir())}
            (tmp / DIR_MARKER).write_text(json.dumps(marker) + "\n")
            out.recheck()  # again: something may have appeared meanwhile


@contextlib.contextmanager
def write_file(out: Output) -> Iterator[Path]:
    """Yield a temporary sibling path (`.NAME.tmp-PID.SUFFIX`: the same suffix) to write;
    when the block ends without an error, record it in the folder's marker and put it in
    place of `out.path`."""
    with writing(out.path, out.key):
        out.path.parent.mkdir(parents=True, exist_ok=True)
        with put_in_place(out.path, f".{out.path.stem}.tmp-{os.getpid()}", out.path.suffix) as tmp:
            yield tmp
            out.recheck()
            # recorded before it is put in place: a marker that cannot be written (a full
            # disk) leaves no output behind that the next run would take for a user's file
            _record(out.path, {"command": out.command, "sha256": file_sha256(tmp)})


def write_text(out: Output, text: str) -> Path:
    """`text` (UTF-8) written to `out` as `write_file` does (a file that holds exactly
    `text` already is left as it is); returns the path."""
    if out.path.is_file() and not out.path.is_symlink() and file_sha256(out.path) == text_sha256(text):
        return out.path
    with write_file(out) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return out.path


def _record(path: Path, entry: dict) -> None:
    """Note in the folder's marker that `path` is the command's; written atomically."""
    markers = path.parent / FILE_MARKERS
    known = read_json(markers)
    known[path.name] = entry
    atomic_write(markers, (json.dumps(known, indent=1, sort_keys=True) + "\n").encode())


def check_place(out: Output, inputs: Iterable[str | os.PathLike | None] = ()) -> None:
    """The rules on where an output may go, whatever is there now: never a run directory
    or checkpoints folder, an input or a path around one, or under a file."""
    _check_not_a_run(out, "name a new path")
    _check_against_inputs(out, [Path(p) for p in inputs if p])
    _check_not_inside_a_run(out)
    _check_parent(out)


def check_folder(out: Output, inputs: Iterable[str | os.PathLike | None], ours: Callable[[str], bool]) -> None:
    """Refuse a folder a command adds entries to (the prepared-data cache) if it is a file,
    cannot be made or written, is or holds an input, is a run directory, or holds entries
    whose names `ours` does not recognise: the command replaces none of them, but a
    folder of the user's is not a cache."""
    _check_not_a_run(out, "name a folder of its own")
    _check_against_inputs(out, [Path(p) for p in inputs if p])
    _check_not_inside_a_run(out)
    if not out.path.exists():
        _check_parent(out)
        return
    if not out.path.is_dir():
        raise out.refuse("exists and is not a folder")
    if not os.access(out.path, os.W_OK | os.X_OK):
        return  # a shared, read-only cache still serves what it holds
    strangers = sorted(p.name for p in out.path.iterdir() if not ours(p.name))
    if strangers:
        raise out.refuse(f"holds files {out.command} did not write ({_listed(strangers)}): name an "
                         "empty or new folder")


def check_input(value: str | os.PathLike | None, key: str, is_dir: bool = False) -> None:
    """Refuse, naming the key, an input path that is missing or of the wrong kind."""
    if value is None:
        return
    path = Path(value).expanduser()
    kind = "directory" if is_dir else "file"
    if not str(value).strip():  # Path("") is ".", the working directory
        raise ConfigError(f"{key}={value}: empty; give a {kind}")
    if not path.exists():
        raise ConfigError(f"{key}={value}: no such {kind}")
    if path.is_dir() != is_dir:
        raise ConfigError(f"{key}={value}: is {'not ' if is_dir else ''}a directory; give a {kind}")


def owned(out: Output) -> bool:
    """Whether `out.path` is what `out.command` wrote there (and, for a file, unchanged)."""
    if out.is_dir:
        if _marked_files(out) is not None:
            return True
        return out.owned_before is not None and out.owned_before(out.path)
    entry = read_json(out.path.parent / FILE_MARKERS).get(out.path.name, {})
    return entry.get("command") == out.command and entry.get("sha256") == file_sha256(out.path)


def _foreign_entries(out: Output) -> list[str]:
    """The entries of a directory the command marked as its own that its marker does not
    list (a user's file put there since); [] for a directory without its marker. A marker
    that lists nothing (no `files`, as none our commands ever wrote) licenses nothing."""
    marker = read_json(out.path / DIR_MARKER)
    if marker.get("command") != out.command:
        return []
    listed = _marked_files(out) or []
    return sorted(p.name for p in out.path.iterdir() if p.name not in {*listed, DIR_MARKER})


def _marked_files(out: Output) -> list[str] | None:
    """The names the directory's marker says `out.command` wrote there; None unless the
    marker is the command's and lists them (every marker written since markers exist does)."""
    marker = read_json(out.path / DIR_MARKER)
    files = marker.get("files")
    if marker.get("command") != out.command or not isinstance(files, list) \
            or not all(isinstance(f, str) for f in files):
        return None
    return files


def _listed(names: list[str]) -> str:
    return ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")


def _marker_name(out: Output) -> str:
    return f"{DIR_MARKER} marker" if out.is_dir else f"entry in {FILE_MARKERS} with its digest"


def _resolved(p: Path) -> Path:
    return p.expanduser().resolve(strict=False)


def _check_against_inputs(out: Output, inputs: list[Path]) -> None:
    target = _resolved(out.path)
    for given in inputs:
        src = _resolved(given)
        if target == src:
            raise out.refuse(f"is an input of this command ({given}): name another output")
        if src in target.parents:
            raise out.refuse(f"is inside an input of this command ({given}): name another output")
        if target in src.parents:
            raise out.refuse(f"holds an input of this command ({given}): name another output")


def _check_not_a_run(out: Output, instead: str) -> None:
    run = _run_directory(out.path)
    if run is not None:
        raise out.refuse(f"is {run}: never an output of {out.command}; {instead}")


def _check_not_inside_a_run(out: Output) -> None:
    """Refuse a path inside a run directory: mt-train owns it (but see `Output.checkpoint`)."""
    target = _resolved(out.path)
    for parent in target.parents:
        run = _run_directory(parent, strict=True)
        if run == "a run's checkpoints folder" and out.checkpoint and parent == target.parent:
            name = out.path.name
            if not out.path.exists() and (name == "best" or STEP_DIR.match(name)):  # an existing one: not ours
                raise out.refuse(f"is the name of a checkpoint mt-train writes in {parent}: "
                                 "name the average otherwise (avg5)")
            if LEFTOVER.match(name):  # resume=auto deletes it, or restores it as `NAME`
                raise out.refuse(f"is named as an unfinished write (NAME.tmp-N, NAME.old-N), which "
                                 f"mt-train tidies away in {parent}: name the average otherwise (avg5)")
            return  # a checkpoint among the run's checkpoints: mt-train leaves it alone
        if run is not None:
            raise out.refuse(f"is inside {parent}, {run}: never an output of {out.command}; "
                             "name a path outside it")


def _run_directory(path: Path, strict: bool = False) -> str | None:
    """What makes `path` a run directory or a run's checkpoints folder, if it is one.

    strict (for the folders above an output): only what mt-train makes, `checkpoints/`
    beside its train.log, config.yaml or .lock, so that a project folder that merely holds
    a `checkpoints/` or a `.lock` is not taken for a run.
    """
    if not path.is_dir():
        return None
    ckpts = (path / "checkpoints").is_dir()
    log, lock = (path / "train.log").is_file(), (path / ".lock").exists()
    if strict:
        is_run = (ckpts and (log or lock or (path / "config.yaml").is_file())) or (log and lock)
    else:
        is_run = ckpts or log or lock
    if is_run:
        return "a run directory"
    if path.name == "checkpoints" and _run_directory(path.parent, strict) is not None:
        return "a run's checkpoints folder"
    if not strict and any(p.name.startswith("step_") and p.is_dir() for p in path.iterdir()):
        return "a checkpoints folder"
    return None


def _check_parent(out: Output) -> None:
    """The nearest existing ancestor must be a folder this process may write in."""
    parent = out.path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise out.refuse(f"cannot be made: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise out.refuse(f"cannot be written: no permission to write in {parent}")
