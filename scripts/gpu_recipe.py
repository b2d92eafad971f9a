"""The GPU recipe in one call: `experiment=europarl_tatoeba_gpu` prepared, trained for six
minutes, averaged, evaluated with beam 5 on the three test sets, and (where ctranslate2 is
installed) exported to int8 and evaluated on the CPU; every figure into one JSON file. Run
it through scripts/gpu_recipe.sh, which packs what the GPU machine lacks and installs it
there (docs/training.md, "The GPU recipe in one call"):

    scripts/gpu_recipe.sh --pack              # here, before a GPU is at hand: fills .gpu/recipe/
    scripts/gpu_recipe.sh                     # on the GPU machine: $OUT/gpu_recipe.json and .log
    scripts/gpu_recipe.sh --cpu --out DIR     # every step at toy size on a CPU (CI)
    scripts/gpu_recipe.sh --steps export      # a step again, on the same machine (its work
                                              # folder, /tmp/gpu_recipe, is kept)
    scripts/gpu_recipe.sh -- optim.lr=7e-4    # mt-train overrides after --, for every step

Steps, each in its own process under its own time limit; the run as a whole has a deadline
(480 s on a GPU), and training gets its six minutes less what the deadline cannot spare:
the time already spent, the train step's own start, validation and checkpoints
(`Plan.train_overhead`) and the later steps' (`Plan.after_train`). The JSON says how long
it trained.
  data      the recipe's corpus prepared from the packed folder (its vocabulary given)
  train     mt-train: updates, tokens/s, peak GPU memory, the learning curve (training
            loss, dev BLEU per dev set at each validation)
  average   mt-average of the last checkpoints; greedy BLEU of the last weights and of the
            average on the first `dev_sentences` of each dev set: the better is evaluated
  evaluate  beam 5 on tatoeba-test, europarl-test and FLORES-200 devtest: BLEU, chrF, TER,
            names, sacrebleu signatures, sentences/s
  export    mt-export quantization=int8 and the same three sets on the CPU (skipped where
            ctranslate2 cannot be imported: its wheel does not travel with the corpus)
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("data", "train", "average", "evaluate", "export")
EXPERIMENT = "experiment=europarl_tatoeba_gpu"
TEST_SETS = ("tatoeba-test", "europarl-test", "flores200-devtest")
DEV_CORPORA = ("europarl", "tatoeba")


@dataclass
class Plan:
    """What each step runs: the GPU's sizes, or toy ones for a CPU (`--cpu`)."""

    device: str
    data_root: str  # the packed corpus folder; its spm.model, if there, is the vocabulary
    overrides: list[str]  # mt-train overrides on top of the experiment
    train_seconds: float  # the recipe's training time (trainer.max_hours), at most
    train_overhead: int  # seconds the train step spends besides training: start, validation, checkpoints
    after_train: int  # seconds kept for average, evaluate and export once training ends
    eval_sentences: int | None  # of each test set (None: all)
    dev_sentences: int  # of each dev set, greedy, to choose between the last and the average
    average_last: int
    limits: dict[str, int] = field(default_factory=dict)  # seconds per step, at most
    deadline: int = 540


GPU = Plan(device="cuda", data_root=".gpu/recipe/data", overrides=[], train_seconds=360, train_overhead=45,
           after_train=110, eval_sentences=None, dev_sentences=500, average_last=5,
           limits={"data": 150, "train": 480, "average": 60, "evaluate": 150, "export": 150}, deadline=480)

CPU = Plan(device="cpu", data_root="", train_seconds=60, train_overhead=30, after_train=60, eval_sentences=20,
           dev_sentences=10, average_last=3,
           overrides=["model.d_model=32", "model.n_heads=4", "model.d_ff=64", "model.n_encoder_layers=2",
                      "model.n_decoder_layers=1", "data.spm_vocab_size=300", "data.max_tokens=512",
                      "data.epoch_pairs=50", "optim.warmup_steps=10", "trainer.max_steps=12",
                      "trainer.val_every=6", "trainer.save_every=3", "trainer.log_every=1",
                      "trainer.val_bleu_sentences=10", "trainer.num_threads=1"],
           limits={"data": 60, "train": 90, "average": 60, "evaluate": 60, "export": 60}, deadline=300)


class StepFailed(Exception):
    """A step ran but its result is wrong: the message says what, in one line."""


# ---- the orchestrator: each step in its own process ----------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="toy sizes on the CPU (CI), no GPU needed")
    ap.add_argument("--data", help="--cpu: train on this packed folder (e.g. .gpu/recipe/data), "
                                   "not a toy copy of data/sample")
    ap.add_argument("--out", default=os.environ.get("OUT") or "gpu_recipe_out",
                    help="where gpu_recipe.json and gpu_recipe.log go (default $OUT)")
    ap.add_argument("--steps", default=",".join(STEPS), help=f"a comma-separated subset of {','.join(STEPS)}")
    ap.add_argument("--vocab", help="write the recipe's vocabulary here: the corpus prepared from "
                                    "../shared/data into data/cache (--pack runs it)")
    ap.add_argument("--step", help=argparse.SUPPRESS)  # internal: run one step in this process
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)  # the packed folder, as the parent chose it
    ap.add_argument("--train-seconds", type=float, help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="mt-train overrides (after --), e.g. optim.lr=7e-4")
    args = ap.parse_args()
    plan = plan_for(args)
    if args.vocab:
        return write_vocabulary(Path(args.vocab), args.overrides)
    if args.step:
        return run_step_here(args.step, plan, Path(args.work), args.overrides, args.train_seconds)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        print(f"gpu_recipe: --steps: unknown step {unknown[0]!r}; choose from {', '.join(STEPS)}", file=sys.stderr)
        return 2
    if not (ROOT / plan.data_root).is_dir() and not (args.cpu and not args.data):
        print(f"gpu_recipe: {plan.data_root} not found: run scripts/gpu_recipe.sh --pack first "
              "and carry .gpu/recipe", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = (out / "work").resolve() if args.cpu else Path(os.environ.get("GPU_RECIPE_WORK", "/tmp/gpu_recipe"))
    work.mkdir(parents=True, exist_ok=True)
    if args.cpu and not args.data:
        args.root = str(toy_corpus(work / "toy"))
        plan = replace(plan, data_root=args.root)
    report = {"mode": "cpu" if args.cpu else "gpu", "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "plan": asdict(plan), "overrides": args.overrides, "steps": {}}
    start = time.monotonic()
    log_path = out / "gpu_recipe.log"
    for name in steps:
        left = int(plan.deadline - (time.monotonic() - start))
        limit, seconds = min(plan.limits[name], left), None
        if name == "train":  # the recipe's time, less what the later steps need
            seconds = min(plan.train_seconds, left - plan.after_train - plan.train_overhead)
            limit = min(int(seconds) + plan.train_overhead + 60, plan.limits["train"], left)
        if limit < 5 or (seconds is not None and seconds < 1):
            report["steps"][name] = {"status": "not run", "why": "the run's deadline was reached"}
        else:
            report["steps"][name] = run_step(name, args, work, log_path, limit, seconds)
        report["passed"] = all(s["status"] in ("passed", "skipped") for s in report["steps"].values())
        write_json(out / "gpu_recipe.json", report)
        s = report["steps"][name]
        print(f"gpu_recipe: {name:<8} {s['status']:<8} {s.get('seconds', 0):6.1f} s  "
              f"{s.get('error') or s.get('why') or ''}", flush=True)
    print(f"gpu_recipe: {'all passed' if report['passed'] else 'FAILED'}; {out / 'gpu_recipe.json'}")
    return 0 if report["passed"] else 1


def plan_for(args: argparse.Namespace) -> Plan:
    if args.root:
        return replace(plan_for(argparse.Namespace(**{**vars(args), "root": None})), data_root=args.root)
    if not args.cpu:
        return GPU
    if args.data:  # the packed corpus on a CPU: its preparation takes minutes, not seconds
        return replace(CPU, data_root=args.data, overrides=[*CPU.overrides, "data.max_train_pairs=20000"],
                       limits={**CPU.limits, "data": 1800}, deadline=CPU.deadline + 1800)
    return CPU


def run_step(name: str, args: argparse.Namespace, work: Path, log_path: Path, limit: int,
             train_seconds: float | None) -> dict:
    """One step in a child process, in a session of its own: at the limit it gets SIGTERM
    (mt-train saves a checkpoint and stops), 30 s later SIGKILL."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--step", name, "--work", str(work)]
    cmd += ["--cpu"] if args.cpu else []
    cmd += ["--data", args.data] if args.data else []
    cmd += ["--root", args.root] if args.root else []
    cmd += ["--train-seconds", str(train_seconds)] if train_seconds else []
    cmd += ["--", *args.overrides] if args.overrides else []
    result_file = work / f"{name}.json"
    result_file.unlink(missing_ok=True)
    t0 = time.monotonic()
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"\n===== step {name} (limit {limit} s) =====\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        rc: int | None
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            rc = None
    result = json.loads(result_file.read_text()) if result_file.exists() else {}
    if rc is None:
        result |= {"status": "failed", "error": f"timed out after {limit} s"}
    elif rc != 0 and "error" not in result:
        result |= {"status": "failed", "error": f"exit status {rc}: {last_line(log_path.read_text(errors='replace'))}"}
    return {"status": result.pop("status", "failed"), "seconds": round(time.monotonic() - t0, 1), **result}


def last_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    tmp.replace(path)


def write_vocabulary(path: Path, user: list[str]) -> int:
    """The recipe's SentencePiece model, from the corpus prepared here as training would
    prepare it (data/cache: reused when there), written to `path` for the GPU machine."""
    from transformer.commands.cli import setup_logging
    from transformer.data.pipeline import prepare_data

    setup_logging("gpu_recipe")
    prepared = prepare_data(compose([EXPERIMENT, *user]).data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(prepared.tokenizer.proto)
    print(f"gpu_recipe: the vocabulary of {prepared.path} ({prepared.tokenizer.vocab_size} pieces) -> {path}")
    return 0


def toy_corpus(folder: Path) -> Path:
    """data/sample laid out as the packed folder is (--cpu): its first 200 training pairs
    as "europarl", the next 200 as "tatoeba" (xz-compressed, as packed), its dev set as
    each corpus's dev set and as the three test sets."""
    sample = ROOT / "data" / "sample"
    lines = {lang: (sample / f"train.{lang}").read_text().splitlines(keepends=True) for lang in ("it", "en")}
    dev = {lang: (sample / f"dev.{lang}").read_text() for lang in ("it", "en")}
    for corpus, rows in (("europarl", slice(0, 200)), ("tatoeba", slice(200, 400))):
        (folder / corpus).mkdir(parents=True, exist_ok=True)
        for lang in ("it", "en"):
            (folder / corpus / f"train.{lang}.xz").write_bytes(lzma.compress("".join(lines[lang][rows]).encode()))
            (folder / corpus / f"dev.{lang}").write_text(dev[lang])
    (folder / "eval").mkdir(exist_ok=True)
    for name in TEST_SETS:
        for lang in ("it", "en"):
            (folder / "eval" / f"{name}.{lang}").write_text(dev[lang])
    return folder


# ---- the steps (in the child) ----------------------------------------------------------


def run_step_here(name: str, plan: Plan, work: Path, user: list[str], train_seconds: float | None) -> int:
    """The child: run the step, write work/<name>.json (figures, status, error)."""
    result: dict = {}
    try:
        overrides = train_overrides(plan, work, user)
        if name == "train":
            result = step_train(plan, work, overrides, train_seconds or plan.train_seconds)
        else:
            result = STEP_FUNCTIONS[name](plan, work, overrides)
        result.setdefault("status", "passed")
    except StepFailed as e:
        result |= {"status": "failed", "error": str(e)}
    except Exception as e:  # a bug or a broken environment: the traceback goes to the log
        import traceback

        traceback.print_exc()
        result |= {"status": "failed", "error": f"{type(e).__name__}: {e}"[:400]}
    write_json(work / f"{name}.json", result)
    return 0 if result["status"] in ("passed", "skipped") else 1


def train_overrides(plan: Plan, work: Path, user: list[str]) -> list[str]:
    """The experiment with the packed corpus and the plan's sizes: the same for every step,
    so the data step's cache is the one training finds."""
    cores = len(os.sched_getaffinity(0))
    spm = Path(plan.data_root) / "spm.model"
    spm = spm if spm.is_absolute() else ROOT / spm
    return [EXPERIMENT, f"data.root={plan.data_root}", f"data.cache_dir={work / 'cache'}",
            f"data.num_proc={max(1, min(cores, 16))}", *([f"data.tokenizer={spm}"] if spm.is_file() else []),
            *plan.overrides, *user]


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from transformer.commands import cli
    from transformer.config import TrainConfig, to_dataclass
    from transformer.paths import CONFIG_DIR

    cli.register_configs()
    cli.register_command("train", TrainConfig)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return to_dataclass(TrainConfig, hydra_compose("train", overrides=overrides))


def step_data(plan: Plan, work: Path, overrides: list[str]) -> dict:
    from transformer.commands.cli import setup_logging
    from transformer.data.pipeline import prepare_data

    setup_logging("gpu_recipe")
    t0 = time.monotonic()
    prepared = prepare_data(compose(overrides).data)
    splits = prepared.stats.get("splits", {})
    import torch

    from transformer.device import describe_cpu

    machine = {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
               "cpu": describe_cpu(), "cores": len(os.sched_getaffinity(0)), "torch": torch.__version__}
    return {"machine": machine, "prepare_seconds": round(time.monotonic() - t0, 1), "reused": prepared.from_cache,
            "vocab_size": prepared.tokenizer.vocab_size, "pairs": dict(prepared.sizes),
            "target_tokens": {k: v["tgt_tokens"] for k, v in splits.items() if k.startswith("train")},
            "phases_seconds": prepared.stats.get("seconds")}


def step_train(plan: Plan, work: Path, overrides: list[str], seconds: float) -> dict:
    import re

    from transformer.inspection.learning_curves import read_scalars

    run_dir = work / "run"
    shutil.rmtree(run_dir, ignore_errors=True)  # the recipe's own work folder
    cmd = [sys.executable, "-m", "transformer.commands.train", *overrides, f"trainer.device={plan.device}",
           "trainer.progress=false", "trainer.resume=never", f"trainer.run_dir={run_dir}",
           f"trainer.max_hours={seconds / 3600:.6f}"]
    print("$", " ".join(cmd), flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    print(proc.stdout[-20000:], proc.stderr[-40000:], sep="\n", flush=True)
    r: dict = {"wall_seconds": round(time.monotonic() - t0, 1), "max_hours": round(seconds / 3600, 6)}
    log = proc.stdout + proc.stderr
    for key, pattern in (("precision", r"precision: (\w+)"), ("parameters", r"model: ([\d,]+) parameters")):
        m = re.search(pattern, log)
        r[key] = m.group(1).replace(",", "") if m else None
    r["parameters"] = int(r["parameters"]) if r["parameters"] else None
    scalars = read_scalars(run_dir) if (run_dir / "tb").is_dir() else {}
    series = {tag: [(step, round(value, 4)) for _, step, value in points] for tag, points in scalars.items()}
    loss = series.get("train/loss", [])
    r["updates"] = loss[-1][0] if loss else 0
    hours = series.get("train/hours", [])
    r["train_seconds"] = round(hours[-1][1] * 3600, 1) if hours else None
    rates = [v for s, v in series.get("train/tokens_per_s", []) if s > 100 or plan.device == "cpu"]
    r["tokens_per_s_median"] = round(statistics.median(rates)) if rates else None
    mem = series.get("train/gpu_mem_gb", [])
    r["peak_gpu_memory_gib"] = round(max(v for _, v in mem), 2) if mem else None
    r["curve"] = {tag: points for tag, points in series.items()
                  if tag in ("train/loss", "train/lr", "train/hours", "train/tokens_per_s", "dev/bleu")
                  or (tag.startswith("dev/") and tag.endswith(("/bleu", "/loss")))}
    if proc.returncode != 0:
        raise StepFailed(f"mt-train exited {proc.returncode}: {last_line(proc.stderr)}")
    if not loss:
        raise StepFailed("mt-train logged no training loss")
    return r


def step_average(plan: Plan, work: Path, overrides: list[str]) -> dict:
    from transformer.checkpoint import step_checkpoints
    from transformer.commands.average import average

    run_dir = work / "run"
    found = step_checkpoints(run_dir)
    if not found:
        raise StepFailed(f"no step checkpoints in {run_dir}: the train step must run first")
    paths = found[-plan.average_last:]
    avg = run_dir / "checkpoints" / "avg"
    shutil.rmtree(avg, ignore_errors=True)
    average(paths, avg)
    r: dict = {"averaged": [p.name for p in paths], "dev_bleu": {}}
    for label, ckpt in (("last", paths[-1]), ("average", avg)):
        r["dev_bleu"][label] = {c: evaluate(plan, work, ckpt, "dev", "greedy", plan.dev_sentences, corpus=c)
                                ["scores"]["BLEU"] for c in DEV_CORPORA}
    mean = {k: statistics.mean(v.values()) for k, v in r["dev_bleu"].items()}
    r["chosen"] = "average" if mean["average"] >= mean["last"] else "last"
    r["checkpoint"] = str(avg if r["chosen"] == "average" else paths[-1])
    return r


def evaluate(plan: Plan, work: Path, checkpoint: Path, test_set: str, method: str, sentences: int | None,
             corpus: str | None = None, device: str | None = None, label: str = "") -> dict:
    from transformer.commands.evaluate import EvaluateConfig
    from transformer.commands.evaluate import evaluate as run_evaluation
    from transformer.config import DataConfig, DecodeConfig

    data = DataConfig(name=corpus or "tatoeba", root=plan.data_root)
    out = work / "eval" / (label or checkpoint.name) / (corpus or "test")
    cfg = EvaluateConfig(checkpoint=str(checkpoint), test_set=test_set, output_dir=str(out), force=True,
                         max_sentences=sentences, device=device or plan.device, progress=False, data=data,
                         decode=DecodeConfig(method=method, beam_size=5),
                         threads=len(os.sched_getaffinity(0)) if (device or plan.device) == "cpu" else None)
    report = run_evaluation(cfg)
    return {k: report[k] for k in ("scores", "signatures", "sentences", "seconds", "sentences_per_second",
                                   "device", "engine")}


def chosen_checkpoint(work: Path) -> str:
    """The checkpoint the average step chose (the average, or the last weights)."""
    found = work / "average.json"
    chosen = json.loads(found.read_text()).get("checkpoint") if found.exists() else None
    if not chosen:
        raise StepFailed("no checkpoint chosen: the average step must run first")
    return chosen


def step_evaluate(plan: Plan, work: Path, overrides: list[str]) -> dict:
    chosen = chosen_checkpoint(work)
    return {"checkpoint": chosen, "beam": 5,
            "test_sets": {t: evaluate(plan, work, Path(chosen), t, "beam", plan.eval_sentences) for t in TEST_SETS}}


def step_export(plan: Plan, work: Path, overrides: list[str]) -> dict:
    try:
        import ctranslate2  # noqa: F401
    except ImportError as e:
        return {"status": "skipped", "why": f"ctranslate2 cannot be imported ({e}): carry .gpu/recipe_ct2 "
                                           "and run --steps export on the same machine"}
    from transformer.deploy.ct2_export import ExportConfig, export_ct2

    chosen = chosen_checkpoint(work)
    out = work / "int8"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.monotonic()
    export_ct2(ExportConfig(checkpoint=chosen, output=str(out), quantization="int8"))
    r = {"checkpoint": chosen, "export_seconds": round(time.monotonic() - t0, 1),
         "export_mib": round(sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / 2**20, 1)}
    r["test_sets"] = {t: evaluate(plan, work, out, t, "beam", plan.eval_sentences, device="cpu", label="int8")
                      for t in TEST_SETS}
    return r


STEP_FUNCTIONS = {"data": step_data, "average": step_average, "evaluate": step_evaluate, "export": step_export}


if __name__ == "__main__":
    sys.exit(main())
