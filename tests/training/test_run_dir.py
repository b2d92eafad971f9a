"""Reruns and sweeps never lose or mix checkpoints; crashes leave nothing unrecoverable."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from transformer import checkpoint as ckpt
from transformer.paths import PROJECT_ROOT
from transformer.training.run_dir import RunDirError, open_run_dir, remove_new_empty_dirs

from helpers import DEBUG, run, scalars, shared_cache


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file of a run's checkpoints and its config.yaml, by relative path."""
    files = [run_dir / "config.yaml", *(run_dir / "checkpoints").rglob("*")]
    return {str(f.relative_to(run_dir)): f.read_bytes() for f in files if f.is_file()}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished 10-step debug run with checkpoints step_5, step_10 and best."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    run(run_dir, "trainer.max_steps=10", "trainer.val_every=5")
    return run_dir


def copy_run(src: Path, dst: Path) -> Path:
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)
    return dst


def first_save_crashed(run_dir: Path) -> int:
    """The run as a kill during its first step checkpoint's save leaves it: `best` written,
    then `step_N.tmp-PID` half written (of a process that is gone); returns N."""
    ckpts = run_dir / "checkpoints"
    step = ckpt.load_meta(ckpts / "best")["step"]
    for p in ckpts.glob("step_*"):
        subprocess.run(["rm", "-r", str(p)], check=True)
    half = ckpts / f"step_{step}.tmp-999999999"
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"half a file")
    return step


def test_a_crash_during_the_first_step_save_starts_the_run_again(finished_run, tmp_path, capfd):
    """It was a dead end: `holds checkpoints (best) but no step checkpoint to resume from` (#51.6)."""
    run_dir = copy_run(finished_run, tmp_path / "run")
    step = first_save_crashed(run_dir)
    best = (run_dir / "checkpoints" / "best" / "model.safetensors").read_bytes()
    trainer = run(run_dir, "trainer.resume=auto", "trainer.max_steps=5", "trainer.val_every=5")
    said = [line for line in capfd.readouterr().err.splitlines() if "starting the run again" in line]
    assert len(said) == 1 and f"holds only best (step {step})" in said[0] and f"step_{step}" in said[0]
    assert trainer.state.step == 5  # from step 0: nothing whole to resume from
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == ["best", "step_5"]  # the half-written step is gone, best is the new run's
    assert (run_dir / "checkpoints" / "best" / "model.safetensors").read_bytes() != best or step == 5


@pytest.mark.parametrize("change", ["no half-written step", "another step half-written",
                                    "best with a trainer state", "best written by mt-average"])
def test_a_best_alone_without_that_evidence_is_still_refused(finished_run, tmp_path, change):
    run_dir = copy_run(finished_run, tmp_path / "run")
    step = first_save_crashed(run_dir)
    ckpts = run_dir / "checkpoints"
    if change == "no half-written step":
        subprocess.run(["rm", "-r", str(ckpts / f"step_{step}.tmp-999999999")], check=True)
    elif change == "another step half-written":
        (ckpts / f"step_{step}.tmp-999999999").rename(ckpts / f"step_{step + 1}.tmp-999999999")
    elif change == "best with a trainer state":
        (ckpts / "best" / ckpt.STATE).write_bytes(b"state")
    else:
        (ckpts / "best" / ".mt-output").write_text('{"command": "mt-average", "files": []}')
    before = {k: v for k, v in snapshot(run_dir).items() if ".tmp-" not in k}
    with pytest.raises(RunDirError, match=r"holds checkpoints \(best\) but no step checkpoint"):
        open_run_dir(run_dir, "auto")
    assert snapshot(run_dir) == before


@pytest.mark.slow
def test_a_real_kill_during_the_first_step_save_starts_the_run_again(tmp_path):
    """A process writes `best`, then is killed (SIGKILL) halfway through `step_10`."""
    script = f"""
import sys, time
sys.path.insert(0, {str(PROJECT_ROOT / "tests")!r})
import torch
from pathlib import Path
from helpers import tiny_checkpoint
from transformer import checkpoint as ckpt
run = Path(sys.argv[1])
model, tokenizer = ckpt.load_model(tiny_checkpoint(run / "seed"))
ckpt.save_checkpoint(run / "checkpoints" / "best", model, tokenizer, "", {{"step": 10}})
(run / "seed").rename(run.parent / "seed")
def stall(obj, f, *a, **k):
    open(f, "wb").write(b"half")
    (run.parent / "writing").touch()
    time.sleep(60)
torch.save = stall
ckpt.save_checkpoint(run / "checkpoints" / "step_10", model, tokenizer, "", {{"step": 10}}, {{"x": 1}})
"""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", script, str(run_dir)],
                            env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    deadline = time.monotonic() + 60
    while not (tmp_path / "writing").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (tmp_path / "writing").exists(), "the writer never reached step_10"
    proc.kill()  # SIGKILL: no cleanup runs
    proc.wait()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["best", f"step_10.tmp-{proc.pid}"]
    opened = open_run_dir(run_dir, "auto")
    opened.close()
    assert opened.resume_from == [] and "best" in opened.owned  # a new run, which may replace best
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["best"]


def test_a_new_run_never_replaces_an_earlier_runs_checkpoints(finished_run, tmp_path):
    run_dir = copy_run(finished_run, tmp_path / "run")
    before = snapshot(run_dir)
    assert {"checkpoints/best/model.safetensors", "checkpoints/step_10/meta.json"} <= before.keys()
    with pytest.raises(RunDirError) as info:
        run(run_dir, "trainer.resume=never", "trainer.max_steps=3")
    message = str(info.value)
    assert f"{run_dir} already holds checkpoints of an earlier run (best, step_10, step_5)" in message
    assert "trainer.resume=auto" in message and "trainer.run_dir=<new directory>" in message
    assert snapshot(run_dir) == before  # not a byte changed, config.yaml included


def test_only_a_best_checkpoint_is_not_resumable_and_is_kept(finished_run, tmp_path):
    run_dir = copy_run(finished_run, tmp_path / "run")
    for step in ("step_5", "step_10"):
        subprocess.run(["rm", "-r", str(run_dir / "checkpoints" / step)], check=True)
    before = snapshot(run_dir)
    with pytest.raises(RunDirError, match=r"holds checkpoints \(best\) but no step checkpoint"):
        run(run_dir, "trainer.resume=auto")
    assert snapshot(run_dir) == before


def test_starting_from_another_runs_checkpoint_needs_a_new_directory(finished_run, tmp_path):
    run_dir = copy_run(finished_run, tmp_path / "run")
    other = copy_run(finished_run, tmp_path / "other") / "checkpoints" / "step_5"
    with pytest.raises(RunDirError, match="already holds checkpoints of another run"):
        run(run_dir, f"trainer.resume={other}", "trainer.max_steps=12")
    trainer = run(tmp_path / "fresh", f"trainer.resume={other}", "trainer.max_steps=7")
    assert trainer.state.step == 7  # into an empty directory it is fine


def test_pruning_touches_only_the_runs_own_checkpoints(finished_run, tmp_path):
    run_dir = copy_run(finished_run, tmp_path / "run")
    deleted = ckpt.prune_checkpoints(run_dir, keep_last=1, owned={"step_10"})
    assert deleted == [] and (run_dir / "checkpoints" / "step_5").is_dir()
    deleted = ckpt.prune_checkpoints(run_dir, keep_last=1, owned={"step_5", "step_10"})
    assert [p.name for p in deleted] == ["step_5"]


def test_resuming_prunes_the_resumed_runs_checkpoints(finished_run, tmp_path):
    run_dir = copy_run(finished_run, tmp_path / "run")
    run(run_dir, "trainer.resume=auto", "trainer.max_steps=20", "trainer.val_every=5",
        "trainer.keep_last=2")
    assert [p.name for p in ckpt.step_checkpoints(run_dir)] == ["step_15", "step_20"]


def test_a_changed_model_config_is_refused_before_anything_is_written(finished_run, tmp_path):
    run_dir = copy_run(finished_run, tmp_path / "run")
    before = snapshot(run_dir)
    with pytest.raises(RunDirError, match=r"the model config changed: model.d_model=64 \(was 32\)"):
        run(run_dir, "trainer.resume=auto", "trainer.max_steps=12", "model.d_model=64")
    assert snapshot(run_dir) == before


def test_an_unreadable_newest_checkpoint_falls_back_to_the_previous(finished_run, tmp_path):
    run_dir = copy_run(finished_run, tmp_path / "run")
    (run_dir / "checkpoints" / "step_10" / "trainer_state.pt").write_bytes(b"truncated")
    trainer = run(run_dir, "trainer.resume=auto", "trainer.max_steps=12", "trainer.log_every=1")
    logged = (run_dir / "train.log").read_text()
    assert f"cannot resume from {run_dir / 'checkpoints' / 'step_10'} (corrupt trainer state" in logged
    assert "falling back to step_5" in logged and "resumed from" in logged
    assert [s for s, _ in scalars(run_dir, "train/loss")][-7:] == list(range(6, 13))
    assert trainer.state.step == 12


def test_a_second_process_cannot_train_into_a_directory_in_use(tmp_path):
    first = open_run_dir(tmp_path / "run", "auto")
    try:
        with pytest.raises(RunDirError, match=rf"{tmp_path / 'run'} is in use by another mt-train \(pid {os.getpid()}\)"):
            open_run_dir(tmp_path / "run", "auto")
    finally:
        first.close()
    open_run_dir(tmp_path / "run", "auto").close()  # released


def test_a_crash_between_the_two_renames_of_best_is_recovered(finished_run, tmp_path):
    """save_checkpoint moves the old `best` aside, then renames the new one into place; a
    crash between the two (a power cut: no handler runs to put the old one back) leaves
    `best.old-PID` and `best.tmp-PID` and no `best`. The next start completes the
    replacement."""
    run_dir = copy_run(finished_run, tmp_path / "run")
    ckpts = run_dir / "checkpoints"
    model, tokenizer = ckpt.load_model(ckpts / "best")
    ckpt.save_checkpoint(tmp_path / "new", model, tokenizer, "new: 1\n", {"step": 99})
    (ckpts / "best").rename(ckpts / f"best.old-{os.getpid()}")  # the first rename
    (tmp_path / "new").rename(ckpts / f"best.tmp-{os.getpid()}")  # the new copy, not yet renamed
    open_run_dir(run_dir, "auto").close()
    assert sorted(p.name for p in ckpts.iterdir()) == ["best", "step_10", "step_5"]
    assert ckpt.load_meta(ckpts / "best")["step"] == 99  # the newer copy


def test_leftovers_are_restored_or_cleaned(finished_run, tmp_path):
    run_dir = copy_run(finished_run, tmp_path / "run")
    ckpts = run_dir / "checkpoints"
    best_meta = ckpt.load_meta(ckpts / "best")
    (ckpts / "best").rename(ckpts / "best.old-4000000")  # crash after the first rename, no new copy
    copy_run(ckpts / "step_5", ckpts / "step_5.old-4000001")  # the swap was done, the clean-up not
    copy_run(ckpts / "step_5", ckpts / "step_15.tmp-4000002")  # a write that never finished
    copy_run(ckpts / "step_5", ckpts / f"step_20.tmp-{os.getppid()}")  # a live process's write
    done = ckpt.recover_interrupted_writes(ckpts)
    assert len(done) == 3
    assert sorted(p.name for p in ckpts.iterdir()) == ["best", "step_10", f"step_20.tmp-{os.getppid()}", "step_5"]
    assert ckpt.load_meta(ckpts / "best") == best_meta


def test_each_job_of_a_sweep_gets_its_own_run_directory(tmp_path):
    """`mt-train -m optim.lr=A,B`: two runs in two directories named after their overrides."""
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "transformer.commands.train", "-m", *DEBUG, "trainer.max_steps=4",
           "trainer.val_every=4", "optim.lr=1e-3,5e-3", f"trainer.run_dir={sweep}",
           f"data.cache_dir={shared_cache()}"]
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [p.name for p in jobs] == [
        "data=sample,debug=default,optim.lr=0.001,trainer.max_steps=4,trainer.val_every=4",
        "data=sample,debug=default,optim.lr=0.005,trainer.max_steps=4,trainer.val_every=4",
    ]
    weights = []
    for job, lr in zip(jobs, ("0.001", "0.005"), strict=True):
        assert [p.name for p in ckpt.step_checkpoints(job)] == ["step_4"]
        assert f"lr: {lr}" in (job / "config.yaml").read_text()
        weights.append(ckpt.load_model(job / "checkpoints" / "step_4")[0].src_embed.weight)
    assert not torch.equal(weights[0], weights[1])  # two different runs
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists()


def test_hydra_run_dir_is_honoured(tmp_path):
    cmd = [sys.executable, "-m", "transformer.commands.train", *DEBUG, "trainer.max_steps=2",
           f"hydra.run.dir={tmp_path / 'elsewhere'}", f"data.cache_dir={shared_cache()}"]
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [p.name for p in ckpt.step_checkpoints(tmp_path / "elsewhere")] == ["step_2"]
    assert f"run_dir: {tmp_path / 'elsewhere'}" in (tmp_path / "elsewhere" / "config.yaml").read_text()
    assert not (tmp_path / "runs").exists()


def test_a_refused_run_takes_back_only_the_empty_directories_it_made(tmp_path):
    old = tmp_path / "old_empty"
    old.mkdir()
    os.utime(old, (time.time() - 3600,) * 2)  # made an hour ago: not this command's
    since = time.time() - 1.0
    keep = tmp_path / "runs" / "keep"
    keep.mkdir(parents=True)
    (keep / "notes.txt").write_text("mine")
    new = tmp_path / "runs" / "sweep" / "job"
    new.mkdir(parents=True)
    assert remove_new_empty_dirs(new, since, tmp_path) == [new, new.parent]  # runs/ holds keep/
    assert (keep / "notes.txt").read_text() == "mine"
    assert remove_new_empty_dirs(old, since, tmp_path) == [] and old.is_dir()
    assert remove_new_empty_dirs(tmp_path, since, tmp_path) == []  # never the stop itself
    outside = tmp_path / "x"
    outside.mkdir()
    assert remove_new_empty_dirs(outside, since, tmp_path / "elsewhere") == [] and outside.is_dir()
