"""The GPU path in one command: the device, the CUDA tests, training speed against
`nn.Transformer`, a short real run, `torchrun` (NCCL) with resume, and decoding, every
figure into one JSON file. Run it through scripts/gpu_check.sh, which prepares the
environment (docs/gpu.md, "Checking a GPU"):

    scripts/gpu_check.sh --pack            # here, before a GPU is at hand: fills .gpu/
    scripts/gpu_check.sh                   # on the GPU machine: $OUT/gpu_check.json and .log
    scripts/gpu_check.sh --cpu --out DIR   # the same steps at toy size on a CPU (CI)
    scripts/gpu_check.sh --steps train,decode   # some steps only (a rerun)
    scripts/gpu_check.sh --quick           # at most 240 s: bench (eager and compiled), a
                                           # short train, the decode profile

scripts/gpu/harness.py runs the steps (the table STEPS at the end): each in its own
process with its own time limit, so a hang costs that step's limit (and a 10 s grace from
SIGTERM to SIGKILL) and no more; the whole run also has a deadline (`--deadline`, 540 s on
a GPU: one call of the device tool, `timeout_s=560`, whose limit is 600 s) that shortens
the last steps' limits. The GPU limits add up to the deadline (25 + 50 + 60 + 130 + 160 +
55 + 60 = 540 s): every step runs in one call. The JSON is rewritten after every step: a
run cut off still says what it found. A step passes when its command succeeded and its
figures meet the stated tolerances; its figures are kept either way; the run passes when
every step passed.

Steps (GPU sizes; `--cpu` runs the same code on data/sample and the tiny model):
  device  name, memory, versions, bf16 support, measured matmul peaks (bf16, fp16, TF32, fp32)
  data    mt-prepare of the corpus the later steps share (SentencePiece, encoded cache)
  tests   pytest -m gpu: counts and each failure's first line
  bench   scripts/bench/bench_train.py, base and big models in bf16 against nn.Transformer:
          target tokens/s, the ratio, MFU against the measured peak; base also
          torch.compile'd (`compile` true and false rows; compiles, graph breaks, the
          first compile's seconds)
  train   the base model on Tatoeba for TRAIN_SECONDS: losses at fixed updates, tokens/s,
          peak GPU memory, dev BLEU, the seconds its first compile took (from its log;
          null where it ran eagerly); then 50 updates in fp32 and fp16 from the same start,
          each update's loss against the bf16 run's within LOSS_RTOL; then
          scripts/profile_update.py over 10 updates: host reads (syncs), kernel launches
          and aten ops per update, the GPU's busy fraction (null on a CPU)
  ddp     torchrun --nproc_per_node=1 (NCCL on a GPU, gloo on a CPU): 20 updates through
          DistributedDataParallel, then a resume to 26
  decode  the trained model on the GPU: beam 5 and greedy on the tatoeba-test sentences,
          beam 5 on europarl-test's first 500 (sent/s), host reads per decoder step; beam 5
          on the CPU; BLEU on the shared sentences within 0.2
  profile scripts/profile_decode.py on the trained model: per decoding batch, decoder
          steps, ms and host ops a step, CUDA allocations and cudaMalloc retries, again
          with expandable_segments (beam 5 and greedy on the tatoeba-test sentences, beam
          5 on europarl-test's first 500). Not in the default run (its limits fill the
          540 s); `--quick` and `--steps ...,profile` run it.

`--quick` (the `QUICK` plan, 240 s): device, data, bench (base and big, eager and
compiled), a 20-second train without the precision comparisons, and the profile: with a
start, it fits beside the GPU recipe in one session's 15 minutes of GPU time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from harness import Harness, StepFailed, last_line, write_json

ROOT = Path(__file__).resolve().parents[2]
LOSS_RTOL = 0.03  # a loss of the first updates in bf16/fp16 against fp32: relative difference
BLEU_ATOL = 0.2  # decoding on the GPU against the CPU, BLEU points on the same sentences


@dataclass
class Plan:
    """What each step runs: the GPU sizes, or toy ones for a CPU (`--cpu`)."""

    device: str
    data: list[str]  # mt-train overrides choosing the corpus (the work dir's cache is added)
    bench_data: list[str]  # scripts/bench/bench_train.py --data and --set
    test_file: str  # the decode step's source; its reference is the same name with .en
    matmul_n: int
    bench_models: list[str]
    bench_compile_models: list[str]  # also run torch.compile'd (a `compile: true` row each)
    bench_precisions: list[str]
    bench_max_tokens: int
    bench_steps: int
    train_model: str
    train_overrides: list[str]
    train_seconds: float
    loss_points: list[int]  # updates whose training loss the JSON reports
    compare_steps: int
    compare_precisions: list[str]  # each against the train run's first updates
    ddp_model: str
    ddp_steps: int
    decode_sentences: int
    decode_cpu_sentences: int
    limits: dict[str, int] = field(default_factory=dict)  # seconds per step
    deadline: int = 450
    steps: list[str] = field(default_factory=list)  # run when --steps is not given
    grace: int = 10  # seconds from a step's SIGTERM at its limit to SIGKILL


GPU = Plan(
    device="cuda",
    data=["data=tatoeba", "data.root=.gpu/data", "data.num_proc=8"],
    bench_data=["--data", "tatoeba", "--set", "root=.gpu/data", "num_proc=8"],
    test_file=".gpu/data/eval/tatoeba-test.it",
    matmul_n=8192,
    bench_models=["base", "big"],
    bench_compile_models=["base"],
    bench_precisions=["bf16"],  # fp16 ran within 5% of bf16 in the first check
    bench_max_tokens=16384,
    bench_steps=6,
    train_model="base",
    # Pre-norm: the paper's post-norm base with this short warm-up diverged on an H200 (at
    # update ~820 of the first check, docs/results/gpu.md "A short run, post-norm against pre-norm"); it needs the paper's
    # 4,000 warm-up updates, more than this run makes. 12k-token batches (~1,400 pairs).
    train_overrides=["model.pre_norm=true", "data.max_tokens=12288", "optim.lr=7e-4",
                     "optim.warmup_steps=500", "trainer.val_every=100000",
                     "trainer.val_bleu_sentences=1000"],
    train_seconds=75,
    loss_points=[1, 10, 50, 100, 200, 500, 1000, 2000],
    compare_steps=50,
    compare_precisions=["fp32", "fp16"],
    ddp_model="small",
    ddp_steps=20,
    decode_sentences=2000,
    decode_cpu_sentences=500,
    # measured on an H200 (2026-11-26): device 9 s, data 29 s, tests ~40 s, bench ~110 s
    # for four eager rows, train 75 s + ~40 s of comparisons, ddp ~50 s (cut at 42 s)
    limits={"device": 25, "data": 50, "tests": 60, "bench": 130, "train": 160, "ddp": 55, "decode": 60,
            "profile": 60},
    deadline=540,
    steps=["device", "data", "tests", "bench", "train", "ddp", "decode"],
)

CPU = Plan(
    device="cpu",
    data=["data=sample", "data.spm_vocab_size=300", "data.num_proc=1"],
    bench_data=["--data", "sample", "--set", "spm_vocab_size=300", "num_proc=1"],
    test_file="data/sample/dev.it",
    matmul_n=256,
    bench_models=["tiny"],
    bench_compile_models=[],  # compiling takes minutes on a 2-core CPU (docs/results/training-speed.md has it measured)
    bench_precisions=["fp32", "bf16"],
    bench_max_tokens=256,
    bench_steps=2,
    train_model="tiny",
    train_overrides=["data.max_tokens=512", "optim.lr=1e-3", "optim.warmup_steps=10",
                     "trainer.max_steps=16", "trainer.val_every=100000",
                     "trainer.val_bleu_sentences=20", "trainer.num_threads=1"],
    train_seconds=60,
    loss_points=[1, 5, 10, 16],
    compare_steps=5,
    compare_precisions=["fp32"],
    ddp_model="tiny",
    ddp_steps=3,
    decode_sentences=20,
    decode_cpu_sentences=20,
    # a shared 2-core CPU under load: two torchrun launches took over 60 s
    limits={"device": 30, "data": 60, "tests": 60, "bench": 60, "train": 150, "ddp": 90, "decode": 40,
            "profile": 40},
    deadline=540,
    steps=["device", "data", "tests", "bench", "train", "ddp", "decode", "profile"],
)

# At most 240 s: the bench's compiled rows are what is new to measure (a row that does not
# fit what is left of the step's limit costs that row only), a model trained for 20 s is
# enough for the decoder step's costs (its outputs run to their length limits: the worst
# case), and the precision comparisons are the full check's.
QUICK = replace(
    GPU, bench_compile_models=["base", "big"], bench_steps=4, train_seconds=20, compare_steps=10,
    compare_precisions=[], loss_points=[1, 10, 50, 100],
    limits={"device": 25, "data": 45, "bench": 95, "train": 40, "profile": 35}, deadline=240,
    steps=["device", "data", "bench", "train", "profile"],
)


# Top-level modules the GPU image has (read there on 2026-11-26 and in the device tool's
# KINDS.md) and those the wheels in .gpu/ bring (scripts/gpu_check.sh --pack). Every
# module-level import of the package must be one or the other, or the check fails on the
# GPU at its first import (tests/test_gpu_check.py).
IMAGE_MODULES = {"torch", "numpy", "sentencepiece", "sacrebleu", "safetensors", "tensorboard", "tqdm",
                 "pyarrow", "matplotlib", "yaml", "pandas", "regex", "requests", "packaging",
                 "filelock", "huggingface_hub", "xxhash", "psutil", "scipy"}
PACKED_MODULES = {"hydra", "omegaconf", "antlr4", "datasets", "dill", "multiprocess", "fsspec",
                  "ctranslate2", "sentence_splitter"}


# ---- the run: scripts/gpu/harness.py runs the step table (STEPS, at the end) ----------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="toy sizes on the CPU (CI), no GPU needed")
    ap.add_argument("--deadline", type=int, default=None, help="seconds for the whole run")
    ap.add_argument("--train-seconds", type=float, default=None, help="the train step's training time")
    ap.add_argument("--quick", action="store_true", help="the QUICK plan: at most 240 s on a GPU")
    HARNESS.add_arguments(ap)
    args = ap.parse_args()
    if args.step:
        return HARNESS.child(args.step, Path(args.work))
    plan = CPU if args.cpu else QUICK if args.quick else GPU
    steps = HARNESS.chosen_steps(args.steps or ",".join(plan.steps))
    if steps is None:
        return 2
    if not args.cpu and not cuda_available():
        print("gpu_check: no CUDA device here; run it on a GPU machine, or with --cpu", file=sys.stderr)
        return 2
    plan = replace(plan, train_seconds=args.train_seconds or plan.train_seconds,
                   deadline=args.deadline or plan.deadline)
    out = Path(args.out)
    work = out / "work" if args.cpu else Path(os.environ.get("GPU_CHECK_WORK", "/tmp/gpu_check"))
    report = {"mode": "cpu" if args.cpu else "gpu", "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "plan": asdict(plan)}
    status = HARNESS.run(plan, steps, out, work, report)
    for name in ("junit.xml",):  # small artefacts worth reading later
        if (work / name).exists():
            shutil.copy(work / name, out / f"gpu_check_{name}")
    return status


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def sh(cmd: list[str], limit: float | None = None, env: dict | None = None) -> str:
    """Run a command from the project root; its output goes to the log and is returned."""
    print("$", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=limit,
                          env={**os.environ, **(env or {})})
    print(proc.stdout[-20000:], proc.stderr[-20000:], sep="\n", flush=True)
    if proc.returncode != 0:
        raise StepFailed(f"`{' '.join(cmd[:4])} ...` exited {proc.returncode}: {last_line(proc.stderr)}")
    return proc.stdout + proc.stderr


# ---- the steps --------------------------------------------------------------------


def step_device(plan: Plan, work: Path, r: dict) -> dict:
    import importlib.metadata
    import platform

    import torch

    from transformer.device import describe_cpu

    sys.path.insert(0, str(ROOT / "scripts" / "bench"))
    from bench_train import matmul_tflops

    device = torch.device(plan.device)
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "cuda": torch.version.cuda}
    for pkg in ("numpy", "pyarrow", "datasets", "hydra-core", "sentencepiece", "sacrebleu", "ctranslate2"):
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = None
    r["versions"] = versions
    r["cpu"] = describe_cpu()
    r["cpu_count"] = os.cpu_count()
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        r |= {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
              "capability": f"{props.major}.{props.minor}", "multiprocessors": props.multi_processor_count,
              "bf16_supported": torch.cuda.is_bf16_supported(),
              "nccl": torch.cuda.nccl.version() if hasattr(torch.cuda, "nccl") else None}
    peaks = {}
    for label, precision, tf32 in (("bf16", "bf16", False), ("fp16", "fp16", False),
                                   ("tf32", "fp32", True), ("fp32", "fp32", False)):
        if device.type == "cpu" and label in ("fp16", "tf32"):
            continue
        torch.backends.cuda.matmul.allow_tf32 = tf32
        peaks[label] = round(matmul_tflops(precision, device, n=plan.matmul_n), 3)
    torch.backends.cuda.matmul.allow_tf32 = False
    r["matmul_tflops"] = peaks
    if device.type == "cuda" and not r["bf16_supported"]:
        raise StepFailed(f"{r['name']} has no bf16: the bf16 steps will fail")
    return r


def step_tests(plan: Plan, work: Path, r: dict) -> dict:
    junit = work / "junit.xml"
    junit.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
           f"--junitxml={junit}", "tests/test_gpu.py"]
    print("$", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    print(proc.stdout[-30000:], proc.stderr[-5000:], sep="\n", flush=True)
    if not junit.exists():
        raise StepFailed(f"pytest wrote no report (exit {proc.returncode}): {last_line(proc.stdout + proc.stderr)}")
    suite = ET.parse(junit).getroot()
    suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    r["counts"] = counts
    r["failures"] = [f"{case.get('name')}: {(bad.get('message') or '').splitlines()[0][:300] if bad.get('message') else ''}"
                     for case in suite.iter("testcase")
                     for bad in list(case.findall("failure")) + list(case.findall("error"))]
    r["skipped"] = sorted({(s.get("message") or "")[:200] for s in suite.iter("skipped")})
    if proc.returncode not in (0, 5):  # 5: nothing selected
        raise StepFailed(f"{counts['failures']} failed, {counts['errors']} errors of {counts['tests']}")
    if plan.device == "cuda" and counts["passed"] == 0:
        raise StepFailed("no GPU test ran: every one was skipped")
    return r


def step_data(plan: Plan, work: Path, r: dict) -> dict:
    """Prepare the corpus once (the later steps find it in the work folder's cache)."""
    t0 = time.monotonic()
    out = sh([sys.executable, "-m", "transformer.commands.prepare", *plan.data, f"data.cache_dir={work / 'cache'}"])
    r["seconds"] = round(time.monotonic() - t0, 1)
    r["reused"] = "reused from" in out
    return r


def step_bench(plan: Plan, work: Path, r: dict) -> dict:
    """Eager rows first (each model), then the compiled ones, each call writing its rows: a
    compile that runs past what is left of the step's limit costs its own row only."""
    t0 = time.monotonic()
    r["results"] = []
    runs = [(m, "false") for m in plan.bench_models] + [(m, "true") for m in plan.bench_compile_models]
    for model, compiled in runs:
        out = work / f"bench_{model}_{compiled}.json"
        left = plan.limits["bench"] - (time.monotonic() - t0) - 5
        try:
            sh([sys.executable, "scripts/bench/bench_train.py", "--model", model, *plan.bench_data,
                f"cache_dir={work / 'cache'}", "--precisions", *plan.bench_precisions, "--compile", compiled,
                "--peak-tflops", "measure", "--matmul-n", str(plan.matmul_n), "--max-tokens",
                str(plan.bench_max_tokens), "--steps", str(plan.bench_steps), "--rounds", "3",
                "--device", plan.device, "--json", str(out)], limit=max(left, 1))
        except subprocess.TimeoutExpired:
            raise StepFailed(f"bench --model {model} --compile {compiled} ran past the step's "
                             f"{plan.limits['bench']} s") from None
        r["results"] += json.loads(out.read_text())
    return r


def train_cmd(plan: Plan, work: Path, run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "transformer.commands.train", f"model={plan.train_model}", *plan.data,
            f"data.cache_dir={work / 'cache'}", *plan.train_overrides, f"trainer.device={plan.device}",
            "trainer.progress=false", "trainer.resume=never", f"trainer.run_dir={run_dir}", *extra]


def tb_scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    if tag not in acc.Tags().get("scalars", []):
        return []
    return [(e.step, e.value) for e in sorted(acc.Scalars(tag), key=lambda e: e.wall_time)]


def step_train(plan: Plan, work: Path, r: dict) -> dict:
    """The real run (precision auto, every update logged), then the same start in each
    of `compare_precisions` for `compare_steps` updates."""
    import math

    run_dir = work / "train"
    shutil.rmtree(run_dir, ignore_errors=True)  # the check's own work folder
    hours = plan.train_seconds / 3600
    extra = [f"trainer.max_hours={hours}", "trainer.log_every=1"]
    if plan.device == "cuda":
        extra.append("trainer.max_steps=1000000")
    t0 = time.monotonic()
    log = sh(train_cmd(plan, work, run_dir, *extra))
    r["wall_seconds"] = round(time.monotonic() - t0, 1)
    r["precision"] = re.search(r"precision: (\w+)", log).group(1)
    compiled = re.search(r"compiled the training step in ([\d.]+) s", log)
    r["first_compile_s"] = float(compiled.group(1)) if compiled else None  # None: eager (a CPU)
    failed = re.search(r"compiling the training step failed \((.*)\); training goes on eagerly", log)
    r["compile_error"] = failed.group(1) if failed else None
    loss = dict(tb_scalars(run_dir, "train/loss"))
    steps = max(loss) if loss else 0
    r["updates"] = steps
    hours = tb_scalars(run_dir, "train/hours")
    r["train_hours"] = hours[-1][1] if hours else None
    r["loss_at"] = {s: round(loss[s], 4) for s in plan.loss_points if s in loss}
    rates = [v for s, v in tb_scalars(run_dir, "train/tokens_per_s") if s > 10]  # after warm-up
    r["tokens_per_s_median"] = round(statistics.median(rates)) if rates else None
    mem = tb_scalars(run_dir, "train/gpu_mem_gb")
    r["peak_gpu_memory_gib"] = round(max(v for _, v in mem), 2) if mem else None
    bleu = tb_scalars(run_dir, "dev/bleu")
    r["dev_bleu"] = round(bleu[-1][1], 2) if bleu else None
    m = re.search(r"model: ([\d,]+) parameters", log)
    r["parameters"] = int(m.group(1).replace(",", "")) if m else None
    if not loss or not all(math.isfinite(v) for v in loss.values()):
        raise StepFailed("no finite training loss was logged")
    if steps < plan.compare_steps:
        raise StepFailed(f"only {steps} updates in {plan.train_seconds} s; need {plan.compare_steps}")
    r["compare"] = {}
    for precision in plan.compare_precisions:
        other = work / f"train_{precision}"
        shutil.rmtree(other, ignore_errors=True)
        sh(train_cmd(plan, work, other, f"trainer.precision={precision}", "trainer.log_every=1",
                     f"trainer.max_steps={plan.compare_steps}", "trainer.val_bleu_sentences=20"))
        theirs = dict(tb_scalars(other, "train/loss"))
        rel = [abs(loss[s] - theirs[s]) / abs(theirs[s]) for s in range(1, plan.compare_steps + 1)]
        r["compare"][precision] = {"max_rel_diff": round(max(rel), 5), "mean_rel_diff": round(statistics.mean(rel), 5),
                                   "loss_at_last": [round(loss[plan.compare_steps], 4),
                                                    round(theirs[plan.compare_steps], 4)]}
    r |= profile_updates(plan, work)
    worst = max((c["max_rel_diff"] for c in r["compare"].values()), default=0.0)
    if worst > LOSS_RTOL:
        raise StepFailed(f"the first {plan.compare_steps} losses of the {r['precision']} run differ from "
                         f"another precision's by up to {worst:.1%} (tolerance {LOSS_RTOL:.0%})")
    return r


def profile_updates(plan: Plan, work: Path) -> dict:
    """scripts/profile_update.py on the train step's model and data: host reads (syncs),
    kernel launches and aten ops per update, the GPU's busy fraction. On a CPU it takes
    the code paths a GPU takes (SDPA attention, F.dropout): the CPU's own fast paths read
    CPU values, which cost no wait."""
    out = work / "profile_update.json"
    cmd = [sys.executable, "scripts/profile_update.py", "--updates", "10", "--json", str(out),
           *(["--device-paths"] if plan.device == "cpu" else []), f"model={plan.train_model}", *plan.data,
           f"data.cache_dir={work / 'cache'}", *plan.train_overrides, f"trainer.device={plan.device}"]
    sh(cmd)
    p = json.loads(out.read_text())
    keys = ("host_syncs_per_update", "kernel_launches_per_update", "aten_ops_per_update",
            "stream_syncs_per_update", "gpu_busy_fraction", "ms_per_update_profiled", "host_reads_by_site")
    return {k: p[k] for k in keys}


def step_ddp(plan: Plan, work: Path, r: dict) -> dict:
    run_dir = work / "ddp"
    shutil.rmtree(run_dir, ignore_errors=True)
    base = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
            "-m", "transformer.commands.train", f"model={plan.ddp_model}", *plan.data,
            f"data.cache_dir={work / 'cache'}", *plan.train_overrides, f"trainer.device={plan.device}",
            "trainer.progress=false", f"trainer.run_dir={run_dir}", "trainer.log_every=1",
            "trainer.val_bleu_sentences=20", "trainer.resume=auto"]
    env = {"OMP_NUM_THREADS": "1"} if plan.device == "cpu" else {}
    first = sh([*base, f"trainer.max_steps={plan.ddp_steps}"], env=env)
    m = re.search(r"distributed: (\w+) backend, (\d+) process", first)
    if not m:
        raise StepFailed("the run did not join a process group (no 'distributed:' log line)")
    r["backend"] = m.group(1)
    want = "nccl" if plan.device == "cuda" else "gloo"
    if r["backend"] != want:
        raise StepFailed(f"backend {r['backend']}, expected {want}")
    more = plan.ddp_steps + max(plan.ddp_steps // 3, 1)
    second = sh([*base, f"trainer.max_steps={more}"], env=env)
    if f"at step {plan.ddp_steps}" not in second or "resumed from" not in second:
        raise StepFailed(f"the second run did not resume from step {plan.ddp_steps}")
    from transformer.checkpoint import load_meta, step_checkpoints

    last = step_checkpoints(run_dir)[-1]
    r["resumed_to"] = load_meta(last)["step"]
    loss = tb_scalars(run_dir, "train/loss")
    r["losses"] = [round(v, 4) for _, v in loss]
    if r["resumed_to"] != more:
        raise StepFailed(f"the resumed run ended at step {r['resumed_to']}, not {more}")
    return r


def step_decode(plan: Plan, work: Path, r: dict) -> dict:
    """Sentences/s of the trained model on the device: beam 5 and greedy on the test
    sentences, beam 5 on europarl-test's long prose (#50's goals); host reads per decoder
    step; then beam 5 on the CPU, and BLEU on the shared sentences within BLEU_ATOL.

    The figures are written to work/decode.json after each run, so a step cut off at its
    limit still reports what it measured."""
    import sacrebleu
    import torch

    from transformer.config import DecodeConfig
    from transformer.data.corpus import read_lines
    from transformer.decoding import search as search_module
    from transformer.decoding.loading import load_for_inference
    from transformer.decoding.settings import decode_settings
    from transformer.decoding.text import translate_nbest

    checkpoint = work / "train" / "checkpoints" / "best"
    if not checkpoint.exists():
        raise StepFailed(f"no trained checkpoint at {checkpoint}: the train step must run first")
    src = read_lines(ROOT / plan.test_file)[: plan.decode_sentences]
    ref = read_lines(ROOT / Path(plan.test_file).with_suffix(".en"))[: len(src)]
    prose_file = ROOT / Path(plan.test_file).parent / "europarl-test.it"  # .gpu/data/eval on a GPU
    prose_file = prose_file if prose_file.exists() else ROOT / plan.test_file  # --cpu: the sample
    prose = read_lines(prose_file)[: max(plan.decode_sentences // 4, 1)]
    prose_ref = read_lines(prose_file.with_suffix(".en"))[: len(prose)]
    beam, greedy = DecodeConfig(method="beam", beam_size=5), DecodeConfig(method="greedy")

    def timed(model, tokenizer, device, lines, refs, cfg) -> tuple[dict, list[str]]:
        translate_nbest(model, tokenizer, lines[:8], cfg, device)  # warm-up: kernels, allocator
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = [h[0][0] for h in translate_nbest(model, tokenizer, lines, cfg, device)]
        if device.type == "cuda":
            torch.cuda.synchronize()
        secs = time.perf_counter() - t0
        return {"sentences": len(lines), "seconds": round(secs, 2), "sentences_per_s": round(len(lines) / secs, 1),
                "bleu": round(sacrebleu.corpus_bleu(out, [refs]).score, 2)}, out

    def save() -> None:  # what is measured so far, should the step be cut off
        write_json(work / "decode.json", {**r, "status": "failed", "error": "cut off before the end"})

    hyps: dict[str, list[str]] = {}
    for device_pref, n in ((plan.device, len(src)), ("cpu", plan.decode_cpu_sentences)):
        if device_pref == "cpu" and "cpu" in hyps:
            continue
        model, tokenizer, device = load_for_inference(str(checkpoint), device_pref, threads=os.cpu_count())
        kind = device.type
        r[kind], hyps[kind] = timed(model, tokenizer, device, src[:n], ref[:n], beam)
        r[kind] |= {"batch_tokens": decode_settings(beam, device, model).batch_tokens,
                    "sync_every": search_module.SYNC_EVERY.get(kind, 1)}
        (work / f"hyp.{kind}.en").write_text("".join(f"{h}\n" for h in hyps[kind]))
        save()
        if device_pref != plan.device:
            break
        runs = r.setdefault(f"{kind}_runs", {})
        runs["greedy"], _ = timed(model, tokenizer, device, src, ref, greedy)
        save()
        runs["beam5_europarl"], _ = timed(model, tokenizer, device, prose, prose_ref, beam)
        save()
        if search_module.SYNC_EVERY.get(kind, 1) != 1:  # the read's cost: reading every step
            every = dict(search_module.SYNC_EVERY)
            search_module.SYNC_EVERY[kind] = 1
            try:
                runs["beam5_sync_every_1"], _ = timed(model, tokenizer, device, src, ref, beam)
            finally:
                search_module.SYNC_EVERY.update(every)
            save()
        few = src[: min(400, max(len(src) // 4, 1))]  # the 400 lines on a GPU; 5 with --cpu
        r[f"{kind}_host_reads"] = count_host_reads(model, tokenizer, device, few, beam, greedy)
        save()
    if "cuda" in hyps:
        n = len(hyps["cpu"])
        same = [sacrebleu.corpus_bleu(hyps[d][:n], [ref[:n]]).score for d in ("cuda", "cpu")]
        r["bleu_on_shared"] = {"sentences": n, "cuda": round(same[0], 2), "cpu": round(same[1], 2)}
        r["identical_lines"] = sum(a == b for a, b in zip(hyps["cuda"], hyps["cpu"]))
        if abs(same[0] - same[1]) > BLEU_ATOL:
            raise StepFailed(f"BLEU on the GPU {same[0]:.2f} against {same[1]:.2f} on the CPU "
                             f"(tolerance {BLEU_ATOL})")
    return r


def count_host_reads(model, tokenizer, device, lines: list[str], *cfgs) -> dict:
    """The host's reads of the device while translating `lines`, per decoder step and per
    sentence, for each DecodeConfig: all of them, and the search's alone (the model's own,
    its id checks and the CPU attention path's, are #49's)."""
    from transformer.decoding.text import translate_nbest
    from transformer.device import HostReads

    out = {}
    decode = model.decode
    for cfg in cfgs:
        steps: list[int] = []
        model.decode = lambda *a, steps=steps, **kw: steps.append(1) or decode(*a, **kw)
        try:
            with HostReads(sites=True) as reads:
                translate_nbest(model, tokenizer, lines, cfg, device)
        finally:
            del model.decode  # the class's method again
        name = "beam5" if cfg.method == "beam" else cfg.method
        search = sum(n for site, n in reads.by_site.items()
                     if site.split(":")[0] in ("search.py", "finished.py", "text.py"))
        out[name] = {"lines": len(lines), "decoder_steps": len(steps), "reads": reads.total,
                     "per_step": round(reads.total / max(len(steps), 1), 2),
                     "per_sentence": round(reads.total / len(lines), 2),
                     "search_per_step": round(search / max(len(steps), 1), 2),  # the model's apart
                     "by_op": dict(reads.by_op), "by_site": dict(reads.by_site.most_common(8))}
    return out


def step_profile(plan: Plan, work: Path, r: dict) -> dict:
    """scripts/profile_decode.py on the train step's model: per decoding batch, decoder
    steps, ms and host ops a step, and on CUDA the allocator's allocations and cudaMalloc
    retries, again in a child under expandable_segments. Each profile's JSON is written
    after every batch, so a step cut off keeps what it measured."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from profile_decode import profile

    from transformer.data.corpus import read_lines

    checkpoint = work / "train" / "checkpoints" / "best"
    if not checkpoint.exists():
        raise StepFailed(f"no trained checkpoint at {checkpoint}: the train step must run first")
    src = read_lines(ROOT / plan.test_file)[: plan.decode_sentences]
    prose_file = ROOT / Path(plan.test_file).parent / "europarl-test.it"
    prose = read_lines(prose_file if prose_file.exists() else ROOT / plan.test_file)[: max(plan.decode_sentences // 4, 1)]
    cuda = plan.device == "cuda"
    # the step eager and compiled as CUDA graphs (graphs traced and recorded per batch, the
    # first compiled step's seconds); a CPU's compile takes minutes: eager only there
    modes = ("none", "reduce-overhead") if cuda else ("none",)
    for name, lines, methods in (("tatoeba", src, ("beam", "greedy")), ("europarl", prose, ("beam",))):
        path = work / f"profile_{name}.json"
        try:
            r[name] = profile(str(checkpoint), lines, device=plan.device, methods=methods,
                              json_path=path, expandable=cuda, compile_modes=modes)
        finally:  # what a cut-off profile measured: its JSON holds every batch done
            if name not in r and path.exists():
                r[name] = json.loads(path.read_text())
        write_json(work / "profile.json", r)
    return r


# The step table, in run order: a step is a row here and a limit in each plan.
STEPS = {"device": step_device, "data": step_data, "tests": step_tests, "bench": step_bench,
         "train": step_train, "ddp": step_ddp, "decode": step_decode, "profile": step_profile}
HARNESS = Harness("gpu_check", Path(__file__).resolve(), STEPS, Plan)

if __name__ == "__main__":
    sys.exit(main())
