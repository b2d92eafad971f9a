"""The table of a study's trials (`mt-train -m hparams_search=...`), best first, in Markdown:
each trial's settings, precision, updates and training time, and the dev scores of its
last validation (BLEU and the name-copy rate on each dev set, and their mean BLEU, the
study's objective). Read from the trials' run directories alone (config.yaml, train.log,
the newest checkpoint's meta.json, TensorBoard), so it works while the study runs: a
trial still training shows its progress and no scores. Where the study's storage
(`optuna.db` in the sweep directory) is there, a column names each row's Optuna trial
numbers: a trial a stopped study asked again shares its run directory with its first
attempt, so a row can hold two.

    python scripts/study_table.py runs/search/europarl_tatoeba_cpu
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

from omegaconf import OmegaConf

from transformer.checkpoint import load_meta, step_checkpoints
from transformer.curves import dev_sets, read_scalars

# (column, path in config.yaml): the settings the prose study searches
SETTINGS = [
    ("layers", ("model.n_encoder_layers", "model.n_decoder_layers")),
    ("d_model/d_ff", ("model.d_model", "model.d_ff")),
    ("dropout", ("model.dropout",)),
    ("lr", ("optim.lr",)),
    ("warm-up", ("optim.warmup_steps",)),
    ("smoothing", ("optim.label_smoothing",)),
    ("max_tokens", ("data.max_tokens",)),
    ("vocab", ("data.spm_vocab_size",)),
    ("tatoeba weight", ("data.corpora.tatoeba",)),
    ("Tatoeba-first epochs", ("data.phases.0.epochs",)),
]


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "–" if value is None else str(value)


def trial_row(run_dir: Path) -> dict:
    """One trial's settings, progress and last dev scores."""
    config = OmegaConf.load(run_dir / "config.yaml")
    row = {name: "/".join(_fmt(OmegaConf.select(config, k)) for k in keys) for name, keys in SETTINGS}
    row["config"] = config  # for trial_numbers
    log = (run_dir / "train.log").read_text() if (run_dir / "train.log").is_file() else ""
    precision = re.search(r"precision: (\w+)", log)
    row["precision"] = precision.group(1) if precision else "?"
    steps = step_checkpoints(run_dir)
    meta = load_meta(steps[-1]) if steps else {}
    row["updates"] = meta.get("step", 0)
    row["hours"] = meta.get("train_seconds", 0.0) / 3600
    row["diverged"] = "diverged" in log
    row["scores"], row["mean"] = {}, None
    if (run_dir / "tb").is_dir():
        scalars = read_scalars(run_dir)
        for name in dev_sets(scalars):
            bleu = scalars.get(f"dev/{name}/bleu")
            names = scalars.get(f"dev/{name}/name_copy")
            if bleu:
                row["scores"][name] = (bleu[-1][2], names[-1][2] if names else None)
        if scalars.get("dev/bleu"):
            row["mean"] = scalars["dev/bleu"][-1][2]
    return row


def trial_numbers(storage: str, study_name: str, rows: list[dict]) -> None:
    """Set each row's "trials" to the Optuna trial numbers whose sampled settings its run
    directory's config.yaml holds (the numbers the study's log and storage use)."""
    import optuna  # the tune extra

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        trials = optuna.load_study(study_name=study_name, storage=storage).get_trials(deepcopy=False)
    except KeyError:
        raise SystemExit(f"study_table: no study {study_name!r} in {storage} (give --study-name)") from None
    for row in rows:
        row["trials"] = ", ".join(str(t.number) for t in trials
                                  if t.params and all(_holds(row["config"], k, v) for k, v in t.params.items()))


def _holds(config, key: str, value) -> bool:
    """Whether a run's config holds a trial's sampled value (floats as written, to rounding)."""
    held = OmegaConf.select(config, key)
    if isinstance(value, float) and isinstance(held, int | float):
        return math.isclose(held, value, rel_tol=1e-12)
    return held == value


def _score(bleu: float, names: float | None) -> str:
    return f"{bleu:.1f} / " + ("–" if names is None else f"{names:.1f}")


def best_first(rows: list[dict]) -> list[dict]:
    """Highest mean dev BLEU first; trials without a score (still training) last."""
    return sorted(rows, key=lambda r: -(r["mean"] or -1))


def markdown(rows: list[dict]) -> str:
    devs = sorted({name for r in rows for name in r["scores"]})
    numbered = any("trials" in r for r in rows)
    head = ["rank", *(["Optuna trial"] if numbered else []), *(name for name, _ in SETTINGS), "precision", "updates", "training h",
            *(f"{d} dev BLEU / names %" for d in devs), "mean dev BLEU"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, r in enumerate(rows, start=1):
        scores = [_score(*r["scores"][d]) if d in r["scores"] else "–" for d in devs]
        mean = "diverged" if r["diverged"] else ("training" if r["mean"] is None else f"{r['mean']:.2f}")
        number = [r.get("trials") or "–"] if numbered else []
        lines.append("| " + " | ".join([str(i), *number, *(r[name] for name, _ in SETTINGS), r["precision"],
                                         f"{r['updates']:,}", f"{r['hours']:.2f}", *scores, mean]) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep_dir", type=Path, help="the study's sweep directory (trainer.run_dir)")
    ap.add_argument("--study-name", default=None,
                    help="the Optuna study in SWEEP_DIR/optuna.db (default: the directory's name)")
    args = ap.parse_args()
    runs = [d for d in sorted(args.sweep_dir.iterdir()) if (d / "config.yaml").is_file()]
    if not runs:
        raise SystemExit(f"study_table: no trial run directories in {args.sweep_dir}")
    rows = [trial_row(d) for d in runs]
    if (args.sweep_dir / "optuna.db").is_file():
        trial_numbers(f"sqlite:///{args.sweep_dir / 'optuna.db'}", args.study_name or args.sweep_dir.name, rows)
    print(markdown(best_first(rows)))
