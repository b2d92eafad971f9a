"""The run directory of one training run, and the rules that keep its checkpoints safe.

A run directory holds one run: `checkpoints/` (`step_N`, `best`), `tb/`, `train.log`,
`config.yaml`. Before any work, `open_run_dir`:
- locks it (`.lock`), so two processes never train into the same directory;
- finishes or undoes checkpoint writes a crash interrupted (`recover_interrupted_writes`);
- decides what the run continues from: with `trainer.resume=auto` the newest step
  checkpoint of the directory (none where a crash came during the first one's save, with
  only `best` written: the run starts again, and says so), with `never` nothing, or the
  checkpoint named;
- refuses to start a new run in a directory that holds another run's checkpoints, naming
  the ways out: a run never deletes or replaces checkpoints it did not write.
`check_resumable` then refuses a model config that differs from the checkpoint's, before
the data is prepared and before `config.yaml` is written. A run refused (or stopped)
before it wrote anything but its lock and log removes the folders opening it made
(`RunDir.remove_if_unused`): a refused run leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from transformer import checkpoint as ckpt
from transformer.config import ConfigError, ModelConfig
from transformer.errors import file_error

try:
    import fcntl
except ImportError:  # not POSIX: no lock
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)
# Fields the tokenizer sets at training time; a resumed run checks the tokenizer itself.
_DATA_FIELDS = ("vocab_size", "pad_id", "bos_id", "eos_id")
# Everything mt-train writes into a run directory; anything else there is someone else's.
RUN_ENTRIES = frozenset({"checkpoints", "tb", "train.log", "config.yaml", ".lock"})


class RunDirError(ConfigError):
    """The run directory cannot be used as the settings ask; the message says why and what to do."""


@dataclass
class RunDir:
    path: Path
    resume_from: list[Path] = field(default_factory=list)  # candidates, newest first; [] = new run
    owned: set[str] = field(default_factory=set)  # checkpoint names this run may replace or prune
    lock: IO | None = None
    created: Path | None = None  # the topmost folder opening it made; None: it was there

    def close(self) -> None:
        if self.lock is not None:
            self.lock.close()  # releases the flock
            self.lock = None

    def remove_if_unused(self) -> None:
        """Remove the folders opening the run made, while they hold nothing but its lock
        and log: a run refused (or stopped) before it wrote anything leaves nothing."""
        if self.created is None or not self.path.is_dir():
            return
        if {p.name for p in self.path.iterdir()} - {".lock", "train.log"}:
            return
        for name in ("train.log", ".lock"):  # while the lock is held: no run can take it first
            (self.path / name).unlink(missing_ok=True)
        self.close()
        folder = self.path
        while True:
            try:
                folder.rmdir()  # only an empty one
            except OSError:
                return
            if folder == self.created:
                return
            folder = folder.parent


def _lock(path: Path) -> IO | None:
    if fcntl is None:
        return None
    path.mkdir(parents=True, exist_ok=True)
    f = open(path / ".lock", "a+")  # noqa: SIM115 (held open for the run)
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise RunDirError(f"{path} is in use by another mt-train ({holder}): wait for it, or "
                          f"give this run its own trainer.run_dir") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}\n")
    f.flush()
    return f


def open_run_dir(path: str | Path, resume: str, is_main: bool = True,
                 made_since: float | None = None) -> RunDir:
    """Lock and tidy `path` (rank 0 only) and decide what the run continues from.

    made_since: when the command started (seconds since the epoch), if it may have made
    `path` itself before this call (Hydra does): an empty `path` last changed since then
    counts as made by the run (`RunDir.created`).

    Raises RunDirError when a new run would start among another run's checkpoints.
    """
    path = Path(path)
    if is_main:
        _check_only_ours(path)
    created = _first_missing(path) if is_main else None
    if is_main and created is None and made_since is not None and _new_and_empty(path, made_since):
        created = path
    try:
        lock = _lock(path) if is_main else None
    except OSError as e:  # a file in the way, no permission, a full disk
        raise file_error(e, path, "use it as the run directory", "trainer.run_dir") from e
    try:
        unfinished: set[str] = set()
        if is_main:
            unfinished = _unfinished_writes(path / "checkpoints")
            ckpt.recover_interrupted_writes(path / "checkpoints")
        return dataclasses.replace(_decide(path, resume, lock, unfinished), created=created)
    except BaseException:
        RunDir(path, lock=lock, created=created).remove_if_unused()
        if lock is not None:
            lock.close()
        raise


def _new_and_empty(path: Path, since: float) -> bool:
    try:
        return path.is_dir() and not any(path.iterdir()) and path.stat().st_mtime >= since
    except OSError:
        return False


def _first_missing(path: Path) -> Path | None:
    """The topmost of `path` and its parents that does not exist yet; None if it does."""
    missing = None
    for folder in (path, *path.parents):
        if folder.exists():
            return missing
        missing = folder
    return missing


def _check_only_ours(path: Path) -> None:
    """A run directory holds only what mt-train writes there: a folder of the user's is
    never a run directory (its config.yaml would be replaced)."""
    if not path.is_dir():
        return
    foreign = sorted(p.name for p in path.iterdir() if p.name not in RUN_ENTRIES)
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise RunDirError(f"trainer.run_dir={path} holds files mt-train did not write ({shown}): "
                          "give the run a directory of its own (a new path)")


def _unfinished_writes(ckpt_dir: Path) -> set[str]:
    """The checkpoints a crash stopped mt-train writing for the first time (`NAME.tmp-PID`
    left, and no `NAME.old-PID`: nothing was being replaced)."""
    if not ckpt_dir.is_dir():
        return set()
    left = [m for p in ckpt_dir.iterdir() if (m := ckpt.LEFTOVER.match(p.name))]
    replacing = {m["name"] for m in left if m["kind"] == "old"}
    return {m["name"] for m in left if m["kind"] == "tmp" and m["name"] not in replacing}


def _decide(path: Path, resume: str, lock: IO | None, unfinished: set[str]) -> RunDir:
    existing = ckpt.checkpoints(path)
    names = {p.name for p in existing}
    shown = ", ".join(sorted(names)[:6]) + (", ..." if len(names) > 6 else "")
    if resume == "never":
        if existing:
            raise RunDirError(
                f"{path} already holds checkpoints of an earlier run ({shown}): continue it with "
                f"trainer.resume=auto, or start a new run with trainer.run_dir=<new directory>")
        return RunDir(path, lock=lock)
    if resume == "auto":
        steps = ckpt.step_checkpoints(path)
        if not steps and _only_a_first_best(path, existing, unfinished):
            return RunDir(path, [], names, lock)  # a new run, which writes its own `best`
        if not steps and existing:
            raise RunDirError(
                f"{path} holds checkpoints ({shown}) but no step checkpoint to resume from: "
                f"start a new run with trainer.run_dir=<new directory>")
        return RunDir(path, steps[::-1], names, lock)
    source = Path(resume)
    inside = source.resolve().parent == (path / "checkpoints").resolve()
    if existing and not inside:
        raise RunDirError(
            f"{path} already holds checkpoints of another run ({shown}): to start from "
            f"{source}, give the new run its own trainer.run_dir")
    return RunDir(path, [source], names, lock)


def _only_a_first_best(path: Path, existing: list[Path], unfinished: set[str]) -> bool:
    """Whether the run's only checkpoint is the `best` mt-train wrote just before a crash
    (a kill, a power cut) stopped it writing its first step checkpoint, `step_N` of the
    same step: weights without a trainer state, written by no other command. Nothing to
    resume from, and nothing of anyone else's: the run starts again (its first validation
    replaces `best`). A `best` alone without that evidence (step checkpoints deleted by
    hand) is still refused."""
    best = path / "checkpoints" / "best"
    if [p.name for p in existing] != ["best"] or (best / ckpt.STATE).exists() \
            or (best / ".mt-output").exists():
        return False
    try:
        step = ckpt.load_meta(best).get("step")
    except ckpt.CheckpointError:
        return False
    if f"step_{step}" not in unfinished:
        return False
    log.warning("trainer.resume=auto: %s holds only best (step %s): the run was stopped while "
                "writing its first step checkpoint, step_%s; starting the run again from step 0",
                path / "checkpoints", step, step)
    return True


def check_resumable(candidate: Path, model_cfg: ModelConfig) -> None:
    """Refuse to resume `candidate` with a model config other than the one it was trained with.

    The vocabulary-derived fields are left to the tokenizer check, after data preparation.
    """
    saved = ckpt.load_model_config(candidate)
    ignore = dict.fromkeys(_DATA_FIELDS)
    old = {k: v for k, v in dataclasses.asdict(saved).items() if k not in ignore}
    new = {k: v for k, v in dataclasses.asdict(model_cfg).items() if k not in ignore}
    changed = [f"model.{k}={new[k]!r} (was {old[k]!r})" for k in old if old[k] != new[k]]
    if changed:
        raise RunDirError(
            f"cannot resume {candidate}: the model config changed: {', '.join(changed)}; set it "
            f"back, or start a new run with trainer.run_dir=<new directory>")


def remove_new_empty_dirs(path: str | Path, since: float, stop: str | Path) -> list[Path]:
    """Remove `path`, then each parent below `stop`, while it is an empty directory last
    changed at or after `since` (seconds since the epoch); returns those removed.

    Hydra makes the run directory (and its missing parents) before the settings are
    checked, so a run refused at once would leave empty directories behind: only they go,
    never a directory that holds anything. A parent's time changes when a child is made
    or removed, so an empty parent that existed before the command goes too; the time
    test protects the run directory itself (an empty one made earlier by hand stays).
    """
    removed: list[Path] = []
    path, stop = Path(path).absolute(), Path(stop).absolute()
    while path != stop and stop in path.parents:
        if not path.exists():  # removed already (`RunDir.remove_if_unused`): on to its parent
            path = path.parent
            continue
        try:
            if not path.is_dir() or any(path.iterdir()) or path.stat().st_mtime < since:
                break
            path.rmdir()
        except OSError:  # another rank removed it first, or it just got a file
            break
        removed.append(path)
        path = path.parent
    return removed
