"""The step harness the GPU scripts share (gpu_check.py, gpu_recipe.py): each is a plan
(its sizes on a GPU and toy ones for `--cpu`) and a step table; this module runs them.

- **Steps in child processes.** The parent runs `<script> --step NAME --work DIR`, which
  reads the plan the parent wrote (`DIR/NAME.plan.json`), calls the table's function and
  writes what it found to `DIR/NAME.json`; its output goes to the run's log.
- **Limits and a deadline.** A step gets its plan's limit (`plan.limits[name]`) or what is
  left of the run's deadline (`plan.deadline`), the smaller; one with under 5 s left is
  "not run". A script may shape a step's limit and plan (`budget`: the recipe's train step).
- **One kill policy.** At its limit a step's whole process group gets SIGTERM (mt-train
  saves a checkpoint and stops), then SIGKILL `plan.grace` seconds later; whatever a step
  leaves running when it ends is stopped the same way, and so is the running step when
  the parent is stopped (SIGTERM, Ctrl-C). A run takes at most its deadline plus one grace.
- **One JSON**, `<out>/<name>.json`, rewritten after every step: a run cut off still says
  what it found. Each step's entry has its status, its seconds and its figures (kept when
  it fails).
- **One meaning of passed.** A step is "passed", "failed", "skipped" (it could not run
  here, with why) or "not run"; the run has passed when every step it ran passed: a
  skipped step is not a passed one.

Adding a step is one row in a script's table (`STEPS = {"name": step_function, ...}`) and
its limit in each plan; a step function takes `(plan, work, r)`, fills `r` with its
figures and returns it, and raises `StepFailed` (or `StepSkipped`) with one line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the project: every step runs there
StepFunction = Callable[[Any, Path, dict], dict]
MIN_LIMIT = 5  # seconds: a step with less left before the deadline is not run


class StepFailed(Exception):
    """A step ran but its result is wrong: the message says what, in one line."""


class StepSkipped(Exception):
    """A step cannot run here (a module this machine lacks): the message says why."""


@dataclass
class Harness:
    """A GPU script's name, its file and its step table (name -> function, in run order).
    The plan (a dataclass of JSON-able fields) has `limits` (seconds per step), `deadline`
    (seconds for the run) and `grace` (seconds from SIGTERM to SIGKILL)."""

    name: str  # names the JSON, the log and the messages: gpu_check.json, "gpu_check: ..."
    script: Path  # the step table's script; the child runs it with --step
    steps: dict[str, StepFunction]
    plan_type: type

    def add_arguments(self, ap: argparse.ArgumentParser) -> None:
        """The flags every GPU script has: --out, --steps and the child's --step, --work."""
        ap.add_argument("--out", default=os.environ.get("OUT") or f"{self.name}_out",
                        help=f"where {self.name}.json and {self.name}.log go (default $OUT)")
        ap.add_argument("--steps", default=None,
                        help=f"a comma-separated subset of {','.join(self.steps)} (default: the plan's)")
        ap.add_argument("--step", help=argparse.SUPPRESS)  # internal: run one step in this process
        ap.add_argument("--work", help=argparse.SUPPRESS)

    def chosen_steps(self, text: str) -> list[str] | None:
        """The steps `--steps` names, in the table's order; None (and one line on stderr)
        for a name not in the table."""
        named = [s.strip() for s in text.split(",") if s.strip()]
        unknown = [s for s in named if s not in self.steps]
        if unknown:
            print(f"{self.name}: --steps: unknown step {unknown[0]!r}; choose from {', '.join(self.steps)}",
                  file=sys.stderr)
            return None
        return named

    def run(self, plan, steps: list[str], out: Path, work: Path, report: dict,
            budget: Callable[[str, Any, int, int], tuple[int, Any]] | None = None) -> int:
        """The parent: `steps` in turn, each in a child; `report` (the JSON's other keys)
        gets "steps" and "passed", and is written after each step. `budget(name, plan,
        limit, left)` may return another limit and plan for a step (a limit under
        MIN_LIMIT: not run). The exit status: 0 when the run passed, else 1."""
        out.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        # SIGTERM to the parent (a job's time limit) unwinds like Ctrl-C, so that the step
        # running in its own session is stopped too (`run_child`'s finally)
        before = signal.signal(signal.SIGTERM, _exit_on_signal)
        try:
            return self._run(plan, steps, out, work, report, budget)
        finally:
            signal.signal(signal.SIGTERM, before)

    def _run(self, plan, steps: list[str], out: Path, work: Path, report: dict,
             budget: Callable[[str, Any, int, int], tuple[int, Any]] | None) -> int:
        report["steps"] = {}
        json_path, log_path = out / f"{self.name}.json", out / f"{self.name}.log"
        deadline = time.monotonic() + plan.deadline
        width = max(map(len, self.steps))
        for name in steps:
            left = int(deadline - time.monotonic())
            limit, step_plan = min(plan.limits[name], left), plan
            if budget:
                limit, step_plan = budget(name, plan, limit, left)
            if limit < MIN_LIMIT:
                report["steps"][name] = {"status": "not run", "why": "the run's deadline was reached"}
            else:
                report["steps"][name] = self.run_child(name, step_plan, work, log_path, limit)
            report["passed"] = passed(report["steps"])
            write_json(json_path, report)
            s = report["steps"][name]
            print(f"{self.name}: {name:<{width}} {s['status']:<8} {s.get('seconds', 0):6.1f} s  "
                  f"{s.get('error') or s.get('why') or ''}", flush=True)
        others = sorted({s["status"] for s in report["steps"].values()} - {"passed"})
        verdict = "all passed" if report["passed"] else f"FAILED (steps {', '.join(others)})"
        print(f"{self.name}: {verdict}; {json_path}")
        return 0 if report["passed"] else 1

    def run_child(self, name: str, plan, work: Path, log_path: Path, limit: int) -> dict:
        """One step in a child process, in a session of its own, under `limit` seconds."""
        write_json(work / f"{name}.plan.json", asdict(plan))
        result_file = work / f"{name}.json"
        result_file.unlink(missing_ok=True)
        cmd = [sys.executable, str(self.script), "--step", name, "--work", str(work)]
        t0 = time.monotonic()
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(f"\n===== step {name} (limit {limit} s) =====\n")
            log.flush()
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            rc: int | None = None
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                pass
            finally:  # also when the parent is interrupted: the child's session is its own
                stop_group(proc, plan.grace)
        result = json.loads(result_file.read_text()) if result_file.exists() else {}
        if rc is None:
            result |= {"status": "failed", "error": f"timed out after {limit} s"}
        elif rc != 0 and "error" not in result:
            result |= {"status": "failed", "error": f"exit status {rc}: {last_line(log_path.read_text(errors='replace'))}"}
        return {"status": result.pop("status", "failed"), "seconds": round(time.monotonic() - t0, 1), **result}

    def child(self, name: str, work: Path) -> int:
        """In the child: the step with the plan the parent wrote; work/<name>.json gets its
        figures, status and error. Exit status 0 unless it failed."""
        plan = self.plan_type(**json.loads((work / f"{name}.plan.json").read_text()))
        result: dict = {}
        try:
            result = self.steps[name](plan, work, result)
            result["status"] = "passed"
        except StepSkipped as e:
            result |= {"status": "skipped", "why": str(e)}
        except StepFailed as e:
            result |= {"status": "failed", "error": str(e)}
        except Exception as e:  # a bug or a broken environment: the traceback goes to the log
            import traceback

            traceback.print_exc()
            result |= {"status": "failed", "error": f"{type(e).__name__}: {e}"[:400]}
        write_json(work / f"{name}.json", result)
        return 1 if result["status"] == "failed" else 0


def _exit_on_signal(signum: int, frame) -> None:
    """A signal's handler: exit as the signal would, through the finally blocks."""
    sys.exit(128 + signum)


def passed(steps: dict[str, dict]) -> bool:
    """The run passed: every step it ran passed (skipped, failed and not run do not)."""
    return bool(steps) and all(s["status"] == "passed" for s in steps.values())


def stop_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM to the process group `proc` leads, SIGKILL `grace` seconds later to whatever
    of it is left; nothing when the group has ended (also when it ends between the look
    and the signal)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0)):
        if not group_alive(proc):
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        end = time.monotonic() + wait
        while time.monotonic() < end and group_alive(proc):
            time.sleep(0.2)
    proc.wait()


def group_alive(proc: subprocess.Popen) -> bool:
    """Whether a process of `proc`'s group still runs. Zombies do not count: the leader is
    reaped here, and an orphan waits for a PID 1 that may never reap it."""
    proc.poll()
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    proc_fs = Path("/proc")
    if not proc_fs.is_dir():
        return True
    for stat in proc_fs.glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # it ended meanwhile
            continue
        state, _, pgrp = text[text.rindex(")") + 2:].split()[:3]  # after "pid (name) "
        if int(pgrp) == proc.pid and state != "Z":
            return True
    return False


def last_line(text: str) -> str:
    """The last non-blank line of `text`, cut to 300 characters (for one-line errors)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def write_json(path: Path, obj) -> None:
    """`obj` as JSON into `path`, whole or not at all (a temporary file renamed over it)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    tmp.replace(path)
