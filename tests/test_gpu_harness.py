"""scripts/gpu/harness.py, the step harness of the two GPU scripts: a toy step table run
through it (each step in a child process), so that its limits, kill policy, JSON and
meaning of "passed" are checked in seconds, apart from the scripts' minutes-long steps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TABLE = textwrap.dedent('''
    import signal, subprocess, sys, time
    from dataclasses import dataclass, field
    from pathlib import Path

    sys.path.insert(0, {gpu!r})
    from harness import Harness, StepFailed, StepSkipped

    @dataclass
    class Plan:
        limits: dict = field(default_factory=dict)
        deadline: int = 60
        grace: int = 1
        size: int = 3

    def ok(plan, work, r):
        r["size"] = plan.size
        return r

    def wrong(plan, work, r):
        r["found"] = 41  # kept although the step fails
        raise StepFailed("41, not 42")

    def absent(plan, work, r):
        raise StepSkipped("no such module here")

    def polite(plan, work, r):  # stops at SIGTERM, as mt-train does
        signal.signal(signal.SIGTERM, lambda *a: (Path(work, "polite.term").write_text("x"), sys.exit(3)))
        time.sleep(60)

    def stubborn(plan, work, r):  # ignores SIGTERM: SIGKILL after the grace
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(60)

    def leaves(plan, work, r):  # passes, but leaves a process running
        Path(work, "leaves.pid").write_text(str(subprocess.Popen(["sleep", "60"]).pid))
        return r

    HARNESS = Harness("toy", Path(__file__).resolve(),
                      {{"ok": ok, "wrong": wrong, "absent": absent, "polite": polite, "stubborn": stubborn,
                       "leaves": leaves}}, Plan)

    if __name__ == "__main__":
        import argparse, json
        ap = argparse.ArgumentParser()
        HARNESS.add_arguments(ap)
        ap.add_argument("--deadline", type=int, default=60)
        args = ap.parse_args()
        if args.step:
            sys.exit(HARNESS.child(args.step, Path(args.work)))
        steps = HARNESS.chosen_steps(args.steps)
        if steps is None:
            sys.exit(2)
        plan = Plan(limits={{s: 10 if s in ("ok", "wrong", "absent", "leaves") else 5 for s in HARNESS.steps}},
                    deadline=args.deadline)
        sys.exit(HARNESS.run(plan, steps, Path(args.out), Path(args.out) / "work", {{"mode": "toy"}}))
''')


def run_toy(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    script = tmp_path / "toy.py"
    script.write_text(TABLE.format(gpu=str(ROOT / "scripts" / "gpu")))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(script), "--out", str(out), *args], capture_output=True, text=True,
                          timeout=120)
    report = json.loads((out / "toy.json").read_text()) if (out / "toy.json").exists() else {}
    return proc, report


def test_a_run_of_passed_steps_passed_and_the_child_got_the_plan(tmp_path):
    proc, report = run_toy(tmp_path, "--steps", "ok")
    assert proc.returncode == 0 and report["passed"] is True, proc.stdout + proc.stderr
    assert report["mode"] == "toy" and report["steps"]["ok"]["status"] == "passed"
    assert report["steps"]["ok"]["size"] == 3  # the plan the parent wrote, read in the child
    assert "toy: all passed" in proc.stdout


def test_a_skipped_step_is_not_a_passed_one(tmp_path):
    proc, report = run_toy(tmp_path, "--steps", "ok,absent")
    assert report["steps"]["absent"] == {"status": "skipped", "seconds": report["steps"]["absent"]["seconds"],
                                         "why": "no such module here"}
    assert report["passed"] is False and proc.returncode == 1
    assert "FAILED (steps skipped)" in proc.stdout


def test_a_failed_step_keeps_its_figures_and_the_later_steps_still_run(tmp_path):
    proc, report = run_toy(tmp_path, "--steps", "wrong,ok")
    wrong = report["steps"]["wrong"]
    assert wrong["status"] == "failed" and wrong["error"] == "41, not 42" and wrong["found"] == 41
    assert report["steps"]["ok"]["status"] == "passed"
    assert report["passed"] is False and proc.returncode == 1


def test_a_step_at_its_limit_gets_sigterm_then_sigkill_after_the_grace(tmp_path):
    t0 = time.monotonic()
    _, report = run_toy(tmp_path, "--steps", "polite,stubborn,ok")
    seconds = time.monotonic() - t0
    for name in ("polite", "stubborn"):
        assert report["steps"][name]["status"] == "failed"
        assert report["steps"][name]["error"] == "timed out after 5 s"
    assert (tmp_path / "out" / "work" / "polite.term").exists()  # it had SIGTERM, and stopped
    assert 6 <= report["steps"]["stubborn"]["seconds"] < 10  # its limit, a 1 s grace, SIGKILL
    assert report["steps"]["ok"]["status"] == "passed" and seconds < 60


def test_a_step_the_deadline_leaves_no_time_is_not_run(tmp_path):
    proc, report = run_toy(tmp_path, "--steps", "stubborn,ok", "--deadline", "8")
    assert report["steps"]["stubborn"]["error"] == "timed out after 5 s"
    assert report["steps"]["ok"] == {"status": "not run", "why": "the run's deadline was reached"}
    assert report["passed"] is False and proc.returncode == 1


def test_an_unknown_step_is_one_line_and_no_json(tmp_path):
    proc, report = run_toy(tmp_path, "--steps", "ok,warp")
    assert proc.returncode == 2 and report == {}
    assert proc.stderr.strip() == "toy: --steps: unknown step 'warp'; choose from ok, wrong, absent, polite, stubborn, leaves"


def test_what_a_step_leaves_running_is_stopped_before_the_next_step(tmp_path):
    _, report = run_toy(tmp_path, "--steps", "leaves,ok")
    assert report["steps"]["leaves"]["status"] == "passed" and report["passed"] is True
    pid = int((tmp_path / "out" / "work" / "leaves.pid").read_text())
    stat = Path(f"/proc/{pid}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"  # gone, or a zombie
    assert report["steps"]["leaves"]["seconds"] < 10  # SIGTERM ended it: no wait for its 60 s


def test_a_parent_stopped_by_sigterm_stops_the_running_step_first(tmp_path):
    script = tmp_path / "toy.py"
    script.write_text(TABLE.format(gpu=str(ROOT / "scripts" / "gpu")))
    parent = subprocess.Popen([sys.executable, str(script), "--out", str(tmp_path / "out"),
                               "--steps", "stubborn"], stdout=subprocess.DEVNULL)
    plan, end = tmp_path / "out" / "work" / "stubborn.plan.json", time.monotonic() + 30
    while not plan.exists() and time.monotonic() < end:
        time.sleep(0.1)
    time.sleep(1)  # the child runs and ignores SIGTERM
    child = step_pids(str(tmp_path))[0]
    parent.send_signal(signal.SIGTERM)
    rc = parent.wait(timeout=30)
    try:  # the child, in a session of its own, had SIGKILL after the 1 s grace
        alive = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        alive = False
    if alive:
        os.kill(child, signal.SIGKILL)
    assert rc == 128 + signal.SIGTERM
    assert not alive, "the step outlived the harness"


def step_pids(where: str) -> list[int]:
    """The processes running a toy step from `where`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:  # it ended meanwhile
            continue
        if b"--step" in args and any(where.encode() in a for a in args):
            found.append(int(cmdline.parent.name))
    return found


def test_a_group_that_ends_between_the_look_and_the_signal_is_no_error(monkeypatch):
    sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
    import harness

    proc = subprocess.Popen(["true"], start_new_session=True)
    proc.wait()
    looks = iter([True])  # alive when looked at, gone when signalled
    monkeypatch.setattr(harness, "group_alive", lambda p: next(looks, False))
    harness.stop_group(proc, 0.5)  # no ProcessLookupError
    assert proc.returncode == 0
