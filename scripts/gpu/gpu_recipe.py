"""The GPU recipe in one call: `experiment=europarl_tatoeba_gpu` prepared, trained for six
minutes, averaged, evaluated with beam 5 on the three test sets, and (where ctranslate2 is
installed) exported to int8 and evaluated on the CPU; every figure into one JSON file. Run
it through scripts/gpu_recipe.sh, which packs what the GPU machine lacks and installs it
there (docs/gpu.md, "The GPU recipe in one call"):

    scripts/gpu_recipe.sh --pack              # here, before a GPU is at hand: fills .gpu/recipe/
    scripts/gpu_recipe.sh                     # on the GPU machine: $OUT/gpu_recipe.json and .log
    scripts/gpu_recipe.sh --cpu --out DIR     # every step at toy size on a CPU (CI)
    scripts/gpu_recipe.sh --steps export      # a step again, on the same machine (its work
                                              # folder, /tmp/gpu_recipe, is kept)
    scripts/gpu_recipe.sh -- optim.lr=7e-4    # mt-train overrides after --, for every step

scripts/gpu/harness.py runs the steps (the table STEPS at the end), each in its own process
under its own time limit (at the limit SIGTERM: mt-train saves and stops; SIGKILL 30 s
later); the run as a whole has a deadline (480 s on a GPU), and training gets its six minutes less what the deadline cannot spare:
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
  export    mt-export quantization=int8 and the same three sets on the CPU: on a GPU not in
            the first call (its ctranslate2 wheel does not travel with the corpus), but a
            second's, `--steps export` (skipped where ctranslate2 cannot be imported; a
            skipped step is not passed)
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from harness import Harness, StepFailed, StepSkipped, last_line

ROOT = Path(__file__).resolve().parents[2]
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
    after_train: int  # seconds kept for average and evaluate (and export) once training ends
    eval_sentences: int | None  # of each test set (None: all)
    dev_sentences: int  # of each dev set, greedy, to choose between the last and the average
    average_last: int
    limits: dict[str, int] = field(default_factory=dict)  # seconds per step, at most
    deadline: int = 540
    grace: int = 30  # seconds from a step's SIGTERM at its limit (mt-train saves and stops) to SIGKILL
    # run when --steps is not given; on a GPU the export is a second call's (`--steps export`,
    # with ctranslate2's wheel, which does not travel beside the corpus)
    steps: list[str] = field(default_factory=lambda: ["data", "train", "average", "evaluate", "export"])


GPU = Plan(device="cuda", data_root=".gpu/recipe/data", overrides=[], train_seconds=360, train_overhead=45,
           after_train=110, eval_sentences=None, dev_sentences=500, average_last=5,
           limits={"data": 150, "train": 480, "average": 60, "evaluate": 150, "export": 150}, deadline=480,
           steps=["data", "train", "average", "evaluate"])

CPU = Plan(device="cpu", data_root="", train_seconds=60, train_overhead=30, after_train=60, eval_sentences=20,
           dev_sentences=10, average_last=3,
           overrides=["model.d_model=32", "model.n_heads=4", "model.d_ff=64", "model.n_encoder_layers=2",
                      "model.n_decoder_layers=1", "data.spm_vocab_size=300", "data.max_tokens=512",
                      "data.epoch_pairs=50", "optim.warmup_steps=10", "trainer.max_steps=12",
                      "trainer.val_every=6", "trainer.save_every=3", "trainer.log_every=1",
                      "trainer.val_bleu_sentences=10", "trainer.num_threads=1"],
           limits={"data": 60, "train": 90, "average": 60, "evaluate": 60, "export": 60}, deadline=300)


# ---- the run: scripts/gpu/harness.py runs the step table (STEPS, at the end) ----------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="toy sizes on the CPU (CI), no GPU needed")
    ap.add_argument("--data", help="--cpu: train on this packed folder (e.g. .gpu/recipe/data), "
                                   "not a toy copy of data/sample")
    ap.add_argument("--vocab", help="write the recipe's vocabulary here: the corpus prepared from "
                                    "../shared/data into data/cache (--pack runs it)")
    HARNESS.add_arguments(ap)
    ap.add_argument("overrides", nargs="*", help="mt-train overrides (after --), e.g. optim.lr=7e-4")
    args = ap.parse_args()
    if args.vocab:
        return write_vocabulary(Path(args.vocab), args.overrides)
    if args.step:
        return HARNESS.child(args.step, Path(args.work))
    plan = plan_for(args)
    steps = HARNESS.chosen_steps(args.steps or ",".join(plan.steps))
    if steps is None:
        return 2
    if not (ROOT / plan.data_root).is_dir() and not (args.cpu and not args.data):
        print(f"gpu_recipe: {plan.data_root} not found: run scripts/gpu_recipe.sh --pack first "
              "and carry .gpu/recipe", file=sys.stderr)
        return 2
    out = Path(args.out)
    work = (out / "work").resolve() if args.cpu else Path(os.environ.get("GPU_RECIPE_WORK", "/tmp/gpu_recipe"))
    if args.cpu and not args.data:
        plan = replace(plan, data_root=str(toy_corpus(work / "toy")))
    report = {"mode": "cpu" if args.cpu else "gpu", "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "plan": asdict(plan), "overrides": args.overrides}
    plan = replace(plan, overrides=[*plan.overrides, *args.overrides])  # every step's, the user's last
    return HARNESS.run(plan, steps, out, work, report, budget=train_budget)


def plan_for(args: argparse.Namespace) -> Plan:
    if not args.cpu:
        return GPU
    if args.data:  # the packed corpus on a CPU: its preparation takes minutes, not seconds
        return replace(CPU, data_root=args.data, overrides=[*CPU.overrides, "data.max_train_pairs=20000"],
                       limits={**CPU.limits, "data": 1800}, deadline=CPU.deadline + 1800)
    return CPU


def train_budget(name: str, plan: Plan, limit: int, left: int) -> tuple[int, Plan]:
    """The train step trains for the recipe's time less what the later steps need (and gets
    no limit when that is under a second); every other step keeps its limit."""
    if name != "train":
        return limit, plan
    seconds = min(plan.train_seconds, left - plan.after_train - plan.train_overhead)
    if seconds < 1:
        return 0, plan
    limit = min(int(seconds) + plan.train_overhead + 60, plan.limits["train"], left)
    return limit, replace(plan, train_seconds=seconds)


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


def train_overrides(plan: Plan, work: Path) -> list[str]:
    """The experiment with the packed corpus and the plan's sizes: the same for every step,
    so the data step's cache is the one training finds."""
    cores = len(os.sched_getaffinity(0))
    spm = Path(plan.data_root) / "spm.model"
    spm = spm if spm.is_absolute() else ROOT / spm
    return [EXPERIMENT, f"data.root={plan.data_root}", f"data.cache_dir={work / 'cache'}",
            f"data.num_proc={max(1, min(cores, 16))}", *([f"data.tokenizer={spm}"] if spm.is_file() else []),
            *plan.overrides]


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


def step_data(plan: Plan, work: Path, r: dict) -> dict:
    from transformer.commands.cli import setup_logging
    from transformer.data.pipeline import prepare_data

    setup_logging("gpu_recipe")
    t0 = time.monotonic()
    prepared = prepare_data(compose(train_overrides(plan, work)).data)
    splits = prepared.stats.get("splits", {})
    import torch

    from transformer.device import describe_cpu

    machine = {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
               "cpu": describe_cpu(), "cores": len(os.sched_getaffinity(0)), "torch": torch.__version__}
    return {"machine": machine, "prepare_seconds": round(time.monotonic() - t0, 1), "reused": prepared.from_cache,
            "vocab_size": prepared.tokenizer.vocab_size, "pairs": dict(prepared.sizes),
            "target_tokens": {k: v["tgt_tokens"] for k, v in splits.items() if k.startswith("train")},
            "phases_seconds": prepared.stats.get("seconds")}


def step_train(plan: Plan, work: Path, r: dict) -> dict:
    """mt-train for `plan.train_seconds` (the harness's budget has set it)."""
    import re

    from transformer.inspection.learning_curves import read_scalars

    run_dir = work / "run"
    shutil.rmtree(run_dir, ignore_errors=True)  # the recipe's own work folder
    seconds = plan.train_seconds
    cmd = [sys.executable, "-m", "transformer.commands.train", *train_overrides(plan, work),
           f"trainer.device={plan.device}",
           "trainer.progress=false", "trainer.resume=never", f"trainer.run_dir={run_dir}",
           f"trainer.max_hours={seconds / 3600:.6f}"]
    print("$", " ".join(cmd), flush=True)
    t0 = time.monotonic()
    # each line on to the step's log as it comes, so that a step cut off at its limit still
    # shows how far it got (the first compiled update, say)
    lines: list[str] = []
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            print(line, end="", flush=True)
            lines.append(line)
    r |= {"wall_seconds": round(time.monotonic() - t0, 1), "max_hours": round(seconds / 3600, 6)}
    log = "".join(lines)
    for key, pattern in (("precision", r"precision: (\w+)"), ("parameters", r"model: ([\d,]+) parameters"),
                         ("first_compile_s", r"compiled the training step in ([\d.]+) s"),
                         ("compile_error", r"compiling the training step failed \((.*)\); training goes on")):
        m = re.search(pattern, log)
        r[key] = m.group(1).replace(",", "") if m else None
    r["first_compile_s"] = float(r["first_compile_s"]) if r["first_compile_s"] else None  # None: eager
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
        raise StepFailed(f"mt-train exited {proc.returncode}: {last_line(log)}")
    if not loss:
        raise StepFailed("mt-train logged no training loss")
    return r


def step_average(plan: Plan, work: Path, r: dict) -> dict:
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
    r |= {"averaged": [p.name for p in paths], "dev_bleu": {}}
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


def step_evaluate(plan: Plan, work: Path, r: dict) -> dict:
    chosen = chosen_checkpoint(work)
    return {"checkpoint": chosen, "beam": 5,
            "test_sets": {t: evaluate(plan, work, Path(chosen), t, "beam", plan.eval_sentences) for t in TEST_SETS}}


def step_export(plan: Plan, work: Path, r: dict) -> dict:
    try:
        import ctranslate2  # noqa: F401
    except ImportError as e:
        raise StepSkipped(f"ctranslate2 cannot be imported ({e}): carry .gpu/recipe_ct2 "
                          "and run --steps export on the same machine") from None
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


# The step table, in run order: a step is a row here and a limit in each plan.
STEPS = {"data": step_data, "train": step_train, "average": step_average, "evaluate": step_evaluate,
         "export": step_export}
HARNESS = Harness("gpu_recipe", Path(__file__).resolve(), STEPS, Plan)

if __name__ == "__main__":
    sys.exit(main())
