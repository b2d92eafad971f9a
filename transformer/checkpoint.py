"""Self-describing checkpoints that never execute code on load.

A checkpoint is a directory:
    model.safetensors   weights (safetensors: tensors only, no pickle)
    model.json          the ModelConfig
    tokenizer.model     the SentencePiece model
    config.yaml         the resolved run config
    meta.json           step, epoch, dev scores, time, the tokenizer's SHA-256
    trainer_state.pt    optimizer, scheduler, grad scaler, RNG states, data position
                        (loaded with torch.load(weights_only=True); optional)
`model.*`, `tokenizer.model` and `config.yaml` are all that translating needs. `load_model`
checks tokenizer.model against the SHA-256 meta.json records: a tokenizer changed after the
checkpoint was written is refused in one line, not decoded with.

Writes are atomic (`atomic_files.put_in_place`): everything goes to `<name>.tmp-<pid>/`,
which is renamed into place only when complete, so a crash or Ctrl-C mid-write leaves the
previous checkpoints intact; replacing an existing `<name>` moves it to `<name>.old-<pid>/`
first and deletes it last. Files and folders follow the user's umask.
`recover_interrupted_writes` finishes or undoes what a crash left of that. A second
checkpoint of the same weights (the trainer's `best` beside its `step_N`) is made of hard
links to the first's files (`save_checkpoint(also=...)`), put in place just before it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model as load_safetensors
from safetensors.torch import save_model as save_safetensors

from transformer.atomic_files import follow_umask, put_in_place, read_json
from transformer.config import ModelConfig
from transformer.data.tokenizer import TOKENIZER_FILE, Tokenizer
from transformer.errors import UserError, writing
from transformer.model.transformer import Transformer, build_model
from transformer.outputs import LEFTOVER, STEP_DIR  # the names of a run's checkpoints folder

WEIGHTS, MODEL_CFG, TOKENIZER, RUN_CFG, META, STATE = (
    "model.safetensors", "model.json", TOKENIZER_FILE, "config.yaml", "meta.json",
    "trainer_state.pt",
)
CHECKPOINTS = "checkpoints"  # a run directory's folder of checkpoints
EVAL_DIR = "outputs/eval"  # mt-evaluate's report folders, one a model, relative to the working directory
TOKENIZER_SHA256 = "tokenizer_sha256"  # meta.json's record of tokenizer.model's SHA-256

log = logging.getLogger(__name__)


class CheckpointError(UserError, RuntimeError):
    """A checkpoint is missing, incomplete or corrupt; the message names the file."""


def save_checkpoint(
    path: str | Path,
    model: Transformer,
    tokenizer: Tokenizer,
    run_config_yaml: str,
    meta: dict[str, Any],
    trainer_state: dict[str, Any] | None = None,
    also: str | Path | None = None,
) -> Path:
    """Write a checkpoint directory atomically; returns its path.

    Args:
        path: the checkpoint directory to write; an existing one is replaced, and only
            once the new one is complete.
        model: the model: its weights (model.safetensors) and config (model.json).
        tokenizer: its SentencePiece tokenizer (tokenizer.model).
        run_config_yaml: the resolved run config, as YAML (config.yaml).
        meta: step, epoch, dev scores, time (meta.json).
        trainer_state: optimizer, scheduler, scaler and RNG states and the data position
            (trainer_state.pt), or None for a checkpoint that only translates.
        also: a second checkpoint directory with the same files but the trainer state
            (the trainer's `best` beside its `step_N`), put in place (atomically too) just
            before `path`: hard links to the files just written (copies where the
            filesystem has no links), so the weights are serialised once. No file of a
            checkpoint is ever written in place, so the two never differ.

    Returns:
        `path`, as a Path.

    Raises:
        UserFileError: the directory cannot be written (a full disk, no permission); the
            previous checkpoint at `path` (and at `also`), if any, is left as it was.
    """
    path = Path(path)
    with _put_in_place(path) as tmp:
        write_checkpoint_files(tmp, model, tokenizer, run_config_yaml, meta, trainer_state)
        if also is not None:
            with _put_in_place(Path(also)) as also_tmp:
                _link_files(tmp, also_tmp, leave_out=STATE)
    return path


@contextlib.contextmanager
def _put_in_place(path: Path) -> Iterator[Path]:
    """`atomic_files.put_in_place` with the names `recover_interrupted_writes` knows
    (`<name>.tmp-<pid>`, `<name>.old-<pid>`), a full disk or a missing permission as one
    line naming the checkpoint: the previous checkpoint stays as it was. (A Ctrl-C or a
    kill between the renames leaves it to `recover_interrupted_writes`.)"""
    with writing(path), put_in_place(path) as tmp:
        yield tmp


def _link_files(src: Path, dst: Path, leave_out: str) -> None:
    """`dst` made, holding hard links to the files of `src` but `leave_out` (copies where
    the filesystem has no hard links)."""
    dst.mkdir()
    for f in sorted(src.iterdir()):
        if f.name == leave_out:
            continue
        try:
            os.link(f, dst / f.name)
        except OSError:
            shutil.copy2(f, dst / f.name)


def write_checkpoint_files(
    folder: Path,
    model: Transformer,
    tokenizer: Tokenizer,
    run_config_yaml: str,
    meta: dict[str, Any],
    trainer_state: dict[str, Any] | None = None,
) -> None:
    """A checkpoint's files in `folder` (made, with its parents), not atomically: callers
    write into a temporary folder and rename it (`save_checkpoint`, `outputs.write_dir`)."""
    folder.mkdir(parents=True)
    save_safetensors(model, str(folder / WEIGHTS))  # handles the tied embedding matrices
    follow_umask(folder / WEIGHTS)  # safetensors writes it owner-only, through a temporary file
    (folder / MODEL_CFG).write_text(json.dumps(asdict(model.cfg), indent=2))
    proto = tokenizer.proto
    (folder / TOKENIZER).write_bytes(proto)
    (folder / RUN_CFG).write_text(run_config_yaml)
    meta = {**meta, TOKENIZER_SHA256: hashlib.sha256(proto).hexdigest()}  # checked by `load_model`
    (folder / META).write_text(json.dumps(meta, indent=2))
    if trainer_state is not None:
        torch.save(trainer_state, folder / STATE)


def _require(path: Path, name: str) -> Path:
    f = path / name
    if not f.is_file():
        raise CheckpointError(f"checkpoint {path} is missing {name}"
                              if path.is_dir() else f"no checkpoint directory at {path}")
    return f


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[Transformer, Tokenizer]:
    """Load the model (in eval mode) and its tokenizer from a checkpoint directory.

    Args:
        path: a checkpoint directory (model.safetensors, model.json, tokenizer.model).
        device: where to put the model.

    Returns:
        The model, built from model.json with the stored weights, in eval mode on
        `device`, and its tokenizer.

    Raises:
        CheckpointError: the directory or one of the three files is missing or corrupt,
            the tokenizer is not the one meta.json records (its SHA-256), or its size is
            not the model's vocab_size (the message names the file).
    """
    path = Path(path)
    cfg = load_model_config(path)
    model = build_model(cfg)
    try:
        load_safetensors(model, str(_require(path, WEIGHTS)), strict=True)
    except CheckpointError:
        raise
    except (SafetensorError, RuntimeError, OSError) as e:
        raise CheckpointError(f"corrupt weights {path / WEIGHTS}: {e}") from e
    tokenizer = load_tokenizer(path)
    if tokenizer.vocab_size != cfg.vocab_size:
        raise CheckpointError(
            f"{path / TOKENIZER} has {tokenizer.vocab_size} pieces but the model in {path} has "
            f"vocab_size={cfg.vocab_size}: the tokenizer does not belong to this checkpoint")
    return model.to(device).eval(), tokenizer


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A checkpoint's tokenizer, checked against the SHA-256 its meta.json records.

    Raises:
        CheckpointError: tokenizer.model is missing, corrupt, or not the one the
            checkpoint was written with (the message names it).
    """
    path = Path(path)
    try:
        proto = _require(path, TOKENIZER).read_bytes()
        _check_tokenizer_digest(path, proto)
        return Tokenizer.from_proto(proto)
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"corrupt tokenizer {path / TOKENIZER}: {e}") from e


def _check_tokenizer_digest(path: Path, proto: bytes) -> None:
    """Refuse a tokenizer.model whose SHA-256 is not the one the checkpoint's meta.json
    records (a checkpoint that records none, or has no readable meta.json, is not checked)."""
    recorded = read_json(path / META).get(TOKENIZER_SHA256)
    if isinstance(recorded, str) and hashlib.sha256(proto).hexdigest() != recorded:
        raise CheckpointError(f"{path / TOKENIZER} is not the tokenizer this checkpoint was written with "
                              f"(its SHA-256 differs from the one {path / META} records): every id would "
                              "decode to another piece; put back the checkpoint's own tokenizer.model")


def load_model_config(path: str | Path) -> ModelConfig:
    """The ModelConfig of a checkpoint (model.json), without loading its weights."""
    f = _require(Path(path), MODEL_CFG)
    try:
        return ModelConfig.from_dict(json.loads(f.read_text()))
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError, OSError) as e:
        raise CheckpointError(f"corrupt or unreadable {f}: {e}") from e


def load_meta(path: str | Path) -> dict[str, Any]:
    f = _require(Path(path), META)
    try:
        return json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as e:
        raise CheckpointError(f"corrupt or unreadable {f}: {e}") from e


def load_trainer_state(path: str | Path) -> dict[str, Any]:
    """The trainer state, unpickled with weights_only=True (tensors and plain containers)."""
    f = _require(Path(path), STATE)
    try:
        return torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"corrupt trainer state {f}: {e}") from e


def find_checkpoint(value: str | os.PathLike, key: str = "checkpoint") -> Path:
    """The checkpoint a command's `key` names, said in a log line where it was chosen.

    A run directory (one holding `checkpoints/`), or that `checkpoints/` folder: its `best`,
    else its newest `step_N` (`best` appears at the run's first validation). Any other
    directory (a checkpoint, an export) is returned as it is, for its loader to check.

    Raises:
        CheckpointError: the path does not exist (the message lists the checkpoints of the
            run it would be in), or a run directory holds no checkpoint yet.
    """
    path = Path(value).expanduser()
    if not path.exists():
        raise CheckpointError(_missing(value, key, path))
    run = path.parent if path.name == CHECKPOINTS else path
    if not path.is_dir() or (path / MODEL_CFG).is_file() or not (run / CHECKPOINTS).is_dir():
        return path
    best, steps = run / CHECKPOINTS / "best", step_checkpoints(run)
    if (best / META).is_file():
        chosen, which = best, "its best checkpoint"
    elif steps:
        chosen, which = steps[-1], "no best yet (no validation has run), so its newest"
    else:
        raise CheckpointError(f"{key}={value}: a run directory without a complete checkpoint yet")
    step = load_meta(chosen).get("step", "?")
    log.info("%s=%s is a run directory: %s, %s (step %s)", key, value, which, chosen, step)
    return chosen


def _missing(value: str | os.PathLike, key: str, path: Path) -> str:
    """A missing checkpoint's message: the checkpoints its run directory holds, if it is in
    one (`runs/x/checkpoints/best` before the first validation)."""
    for folder in (path.parent, path.parent / CHECKPOINTS):
        if folder.name == CHECKPOINTS and folder.is_dir():
            names = [p.name for p in checkpoints(folder.parent)]
            held = f"holds {', '.join(names)}" if names else "holds no complete checkpoint"
            later = "" if "best" in names else \
                " (best is written at the run's first validation; checkpoint=RUN_DIR takes the newest)"
            return f"{key}={value}: no such directory; {folder} {held}{later}"
    return f"{key}={value}: no such directory"


def step_checkpoints(run_dir: str | Path) -> list[Path]:
    """The complete `step_N` checkpoints of a run directory, oldest first."""
    ckpt_dir = Path(run_dir) / CHECKPOINTS
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir()
             if (m := STEP_DIR.match(p.name)) and (p / META).is_file()]
    return [p for _, p in sorted(found)]


def checkpoints(run_dir: str | Path) -> list[Path]:
    """Every complete checkpoint of a run directory (step_N, best, averages), by name."""
    ckpt_dir = Path(run_dir) / CHECKPOINTS
    if not ckpt_dir.is_dir():
        return []
    return sorted(p for p in ckpt_dir.iterdir() if p.is_dir() and not LEFTOVER.match(p.name)
                  and (p / META).is_file())


def prune_checkpoints(run_dir: str | Path, keep_last: int, owned: set[str]) -> list[Path]:
    """Delete all but the newest `keep_last` step checkpoints among `owned` (names of this
    run's checkpoints): a run never deletes a checkpoint it did not write. `best` is
    separate; keep_last=0 keeps all. Returns the deleted paths."""
    mine = [p for p in step_checkpoints(run_dir) if p.name in owned]
    doomed = mine[:-keep_last] if keep_last > 0 else []
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return False  # our own leftover: this process is not writing it now
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def recover_interrupted_writes(ckpt_dir: str | Path) -> list[str]:
    """Finish or undo the checkpoint writes a crash interrupted; returns what was done.

    `save_checkpoint` writes X.tmp-PID, renames an existing X to X.old-PID, renames
    X.tmp-PID to X, and deletes X.old-PID. What a crash can leave, and what becomes of it:
    - X.old-PID and X: only the last deletion was missed: X.old-PID is deleted;
    - X.old-PID without X: the crash fell between the two renames, so X.tmp-PID, if
      there, is complete and becomes X (the newer copy); otherwise X.old-PID is put back;
    - X.tmp-PID alone: the write did not finish: deleted (X, if any, is the previous copy).
    Leftovers of a process that is still running are left alone.
    """
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    done = []
    found = [(m.groupdict(), p) for p in ckpt_dir.iterdir() if (m := LEFTOVER.match(p.name))]
    found.sort(key=lambda mp: (mp[0]["kind"] != "old", mp[1].name))  # .old first: it may claim a .tmp
    for m, p in found:
        if not p.exists() or _running(int(m["pid"])):
            continue
        final = ckpt_dir / m["name"]
        tmp = ckpt_dir / f"{m['name']}.tmp-{m['pid']}"
        if m["kind"] == "old" and final.exists():
            shutil.rmtree(p, ignore_errors=True)
            done.append(f"deleted {p.name}, the replaced copy of {final.name}")
        elif m["kind"] == "old" and tmp.is_dir():
            tmp.rename(final)
            shutil.rmtree(p, ignore_errors=True)
            done.append(f"completed the interrupted replacement of {final.name} from {tmp.name}")
        elif m["kind"] == "old":
            p.rename(final)
            done.append(f"restored {final.name} from {p.name}")
        else:  # a .tmp whose write did not finish
            shutil.rmtree(p, ignore_errors=True)
            done.append(f"deleted {p.name}, an unfinished write")
    for line in done:
        log.warning("checkpoints: %s (in %s)", line, ckpt_dir)
    return done


def model_name(checkpoint: str) -> str:
    """A model's folder name under outputs/eval: `<run>-<checkpoint>` for a checkpoint in a
    run's checkpoints folder (`sample-best`), else the directory's own name (an export)."""
    path = Path(checkpoint).expanduser().resolve()
    return f"{path.parent.parent.name}-{path.name}" if path.parent.name == CHECKPOINTS else path.name
