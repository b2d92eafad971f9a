"""The Europarl recipe's memory peak: where in the run it happens, and how high.

Runs `mt-train experiment=europarl_tatoeba_cpu_2h` for its first `--steps` updates with one
validation at the last, from a cold cache (a fresh `data.cache_dir` in a temporary folder,
so the vocabulary is trained and the corpora cleaned and encoded inside the run), and
samples the training process's /proc/PID/status every `--every` seconds: the resident set
(VmRSS; VmHWM is the kernel's own high-water mark), its anonymous part (RssAnon: what the
process holds) and its file-backed part (RssFile: the memory-mapped Arrow cache and the
libraries, which the kernel can reclaim). Preparation's worker processes (`data.num_proc`)
are separate processes, reported apart as the tree's total.

Each sample is put in the phase the log had reached: `prepare` (cleaning, the vocabulary,
encoding), `train` (from the model's log line), `validate` (from the log line of the
update validated until its dev scores), `save`. It prints the peak, its phase and the log
line before it, and each phase's highest reading; `--csv` writes every sample.

    python scripts/bench/peak_memory.py                            # precision auto, 300 updates
    python scripts/bench/peak_memory.py --precision bf16           # the bf16 path (emulated
                                                             # without native bf16: slow)
    python scripts/bench/peak_memory.py --steps 50 -- data.max_tokens=2048   # more overrides
"""

from __future__ import annotations

import argparse
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import transformer.commands  # noqa: F401  before torch: the OpenMP wait policy mt-train runs under
from transformer.device import describe_cpu
from transformer.paths import PROJECT_ROOT

GB = 2**30
FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile")
LOG_LINE = re.compile(r"^\S+ \S+ (?:INFO|WARNING|ERROR) \S+: (.*)$")  # mt-train's log format


def status(pid: int) -> dict[str, int]:
    """The memory fields of /proc/PID/status, in bytes (empty once the process is gone)."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in FIELDS:
                out[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return out


def children_rss(pid: int) -> int:
    """Resident bytes of `pid`'s descendants (preparation's workers)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents.setdefault(int(stat.read_text().rsplit(")", 1)[1].split()[1]), []).append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    total, todo = 0, list(parents.get(pid, []))
    while todo:
        child = todo.pop()
        total += status(child).get("VmRSS", 0)
        todo += parents.get(child, [])
    return total


class Phases:
    """The run's phase, from its log lines (mt-train's own messages)."""

    def __init__(self, val_step: int) -> None:
        self.phase, self.line = "prepare", "(start)"
        self.val_line = re.compile(rf"step {val_step}: loss ")
        self.dev_line = re.compile(rf"step {val_step} (dev|mean dev|dev BLEU)")

    def see(self, line: str) -> None:
        if m := LOG_LINE.match(line):
            self.line = m.group(1)[:120]
        if self.phase == "prepare" and "model: " in line and "parameters" in line:
            self.phase = "train"
        elif self.phase == "train" and self.val_line.search(line):
            self.phase = "validate"
        elif self.phase == "validate" and self.dev_line.search(line):
            self.phase = "save"


def measure(cmd: list[str], log: Path, phases: Phases, every: float) -> tuple[int, list[dict]]:
    """Run `cmd`, its output to `log`, sampling its memory every `every` seconds."""
    samples: list[dict] = []
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        start, done = time.perf_counter(), threading.Event()

        def sample() -> None:
            while not done.wait(every):
                mem = status(proc.pid)
                if mem:
                    samples.append({"t": time.perf_counter() - start, "phase": phases.phase,
                                    "after": phases.line, "tree": mem.get("VmRSS", 0) + children_rss(proc.pid),
                                    **mem})

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        for line in proc.stdout:
            out.write(line)
            out.flush()
            phases.see(line.rstrip("\n"))
        code = proc.wait()
        done.set()
        sampler.join()
    return code, samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experiment", default="europarl_tatoeba_cpu_2h")
    ap.add_argument("--steps", type=int, default=300, help="updates; one validation at the last")
    ap.add_argument("--precision", default="auto", help="trainer.precision (auto, fp32, bf16)")
    ap.add_argument("--every", type=float, default=0.5, help="seconds between samples")
    ap.add_argument("--workdir", default=None, help="where the cold cache and the run go (a temp dir)")
    ap.add_argument("--csv", default=None, help="write every sample to this file")
    ap.add_argument("--keep", action="store_true", help="keep the cache, the run and train.log")
    ap.add_argument("overrides", nargs="*", help="more mt-train overrides (after --)")
    args = ap.parse_args()
    print(f"CPU: {describe_cpu()}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="peak_memory-", dir=args.workdir))
    cmd = [sys.executable, "-m", "transformer.commands.train", f"experiment={args.experiment}",
           f"trainer.max_steps={args.steps}", f"trainer.val_every={args.steps}", "trainer.max_hours=null",
           f"trainer.precision={args.precision}", f"trainer.save_every={args.steps}",
           "trainer.progress=false", f"data.cache_dir={work / 'cache'}", f"trainer.run_dir={work / 'run'}",
           *args.overrides]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    try:
        code, samples = measure(cmd, work / "train.log", Phases(args.steps), args.every)
        maxrss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # as /usr/bin/time -v
        if code != 0 or not samples:
            sys.exit(f"peak_memory: mt-train failed ({code}); see {work / 'train.log'}")
        report(samples, maxrss if maxrss > before * 1024 else 0, args)
        if args.csv:
            with open(args.csv, "w") as f:
                f.write("seconds,phase,rss_gb,anon_gb,file_gb,tree_gb,after\n")
                for s in samples:
                    after = s["after"].replace('"', "'")
                    f.write(f"{s['t']:.1f},{s['phase']},{s.get('VmRSS', 0) / GB:.3f},{s.get('RssAnon', 0) / GB:.3f},"
                            f"{s.get('RssFile', 0) / GB:.3f},{s['tree'] / GB:.3f},\"{after}\"\n")
    finally:
        if args.keep:
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def report(samples: list[dict], maxrss: int, args: argparse.Namespace) -> None:
    peak = max(samples, key=lambda s: s.get("VmRSS", 0))
    hwm = max(s.get("VmHWM", 0) for s in samples)
    print(f"\n{args.experiment}, {args.steps} updates + 1 validation, cold cache, precision {args.precision}, "
          f"{' '.join(args.overrides) or 'no other overrides'} ({PROJECT_ROOT.name})")
    print(f"peak resident set: {hwm / GB:.2f} GB (VmHWM; max RSS as /usr/bin/time -v: {maxrss / GB:.2f} GB)")
    print(f"highest sample: {peak['VmRSS'] / GB:.2f} GB at {peak['t']:.0f} s, phase {peak['phase']} "
          f"(anonymous {peak['RssAnon'] / GB:.2f} GB, file-backed {peak['RssFile'] / GB:.2f} GB), "
          f"after: {peak['after']}")
    print("| phase | seconds | highest RSS | highest anonymous | highest file-backed | highest tree RSS |")
    print("|---|---:|---:|---:|---:|---:|")
    for phase in ("prepare", "train", "validate", "save"):
        rows = [s for s in samples if s["phase"] == phase]
        if rows:
            print(f"| {phase} | {rows[-1]['t'] - rows[0]['t']:.0f} | {max(s['VmRSS'] for s in rows) / GB:.2f} GB "
                  f"| {max(s['RssAnon'] for s in rows) / GB:.2f} GB | {max(s['RssFile'] for s in rows) / GB:.2f} GB "
                  f"| {max(s['tree'] for s in rows) / GB:.2f} GB |")


if __name__ == "__main__":
    main()
