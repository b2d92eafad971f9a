"""The table of a study's trials (`mt-train -m hparams_search=...`), best first, in Markdown:
each trial's settings, precision, updates and training time, and the dev scores of its
last validation (BLEU and the name-copy rate on each dev set, and their mean BLEU, the
study's objective). Read from the trials' run directories alone (config.yaml, train.log,
the newest checkpoint's meta.json, TensorBoard), so it works while the study runs: a
trial still training shows its progress and no scores. Where the study's storage
(`optuna.db` in the sweep directory) is there, a column names each row's Optuna trial
numbers: a trial a stopped study asked again shares its run directory with its first
attempt, so a row can hold two.

    python scripts/studies/study_table.py runs/search/europarl_tatoeba_cpu

With --command N it prints instead the `mt-train` command that trains Optuna trial N again
outside the study, its configuration exactly (every setting where the trial's config.yaml
differs from the study's experiment), with the overrides given after it on top, e.g. the
two-hour confirmation of a proxy trial:

    python scripts/studies/study_table.py runs/search/europarl_tatoeba_cpu --command 10 \
        trainer.max_hours=2 trainer.run_dir=runs/confirm/trial10
"""

from __future__ import annotations

import argparse
import math
import re
import shlex
from pathlib import Path

from omegaconf import OmegaConf

from transformer.checkpoint import load_meta, step_checkpoints
from transformer.inspection.learning_curves import dev_sets, read_scalars

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
    row["config"], row["run_dir"] = config, run_dir  # for trial_numbers, trial_overrides
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


def row_of(trial: int, rows: list[dict]) -> dict:
    """The row of Optuna trial `trial` (rows numbered by `trial_numbers`)."""
    for row in rows:
        if str(trial) in row.get("trials", "").split(", "):
            return row
    raise SystemExit(f"study_table: no run directory holds the settings of trial {trial}")


def study_experiment(sweep_dir: Path) -> str:
    """The experiment a study searches around: `override /experiment: X` in
    configs/hparams_search/<sweep dir name>.yaml."""
    search = Path(__file__).resolve().parents[2] / "configs" / "hparams_search" / f"{sweep_dir.name}.yaml"
    if search.is_file():
        for entry in OmegaConf.to_container(OmegaConf.load(search)).get("defaults", []):
            if isinstance(entry, dict) and "override /experiment" in entry:
                return entry["override /experiment"]
    raise SystemExit(f"study_table: no configs/hparams_search/{sweep_dir.name}.yaml naming its experiment "
                     "(give --experiment)")


def _flat(node, prefix: str = "") -> dict:
    """{"a.b.c": leaf}; a list is one leaf (Hydra overrides a list whole)."""
    if not isinstance(node, dict):
        return {prefix: node}
    return {k: v for key, value in node.items() for k, v in _flat(value, f"{prefix}{key}.").items()} \
        if node else {prefix: node}


def _value(v) -> str:
    """A Python value in Hydra's override grammar."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_value(x)}" for k, x in v.items()) + "}"
    plain = re.fullmatch(r"[A-Za-z_./][\w./-]*", v) and v.lower() not in {"true", "false", "null", "inf", "nan"}
    return v if plain else "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"


def trial_overrides(row: dict, experiment: str, extra: list[str]) -> list[str]:
    """`experiment=X` and the overrides that make a fresh `mt-train` compose the config.yaml
    of a trial's row (`trial_row`), less its run directory and the keys `extra` sets, then
    `extra`."""
    from hydra import compose, initialize_config_dir

    from transformer.commands.cli import CONFIG_PATH, register_configs

    register_configs()  # the groups' dataclass schemas, as mt-train composes them
    with initialize_config_dir(config_dir=CONFIG_PATH, version_base="1.3"):
        base = _flat(OmegaConf.to_container(compose("train", overrides=[f"experiment={experiment}"]), resolve=True))
    trial = _flat(OmegaConf.to_container(row["config"], resolve=True))
    unknown = sorted(set(trial) - set(base))
    if unknown:
        raise SystemExit(f"study_table: {row['run_dir'] / 'config.yaml'}: keys the config schema no longer has: "
                         + ", ".join(k[:-1] for k in unknown))
    given = {o.split("=", 1)[0].lstrip("+~") for o in extra}
    changed = [f"{key[:-1]}={_value(value)}" for key, value in trial.items()
               if value != base[key] and key[:-1] not in given and key[:-1] != "trainer.run_dir"]
    return [f"experiment={experiment}", *changed, *extra]


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
    ap.add_argument("--command", type=int, metavar="N",
                    help="print the mt-train command that trains Optuna trial N again, OVERRIDES on top")
    ap.add_argument("--experiment", default=None,
                    help="with --command: the experiment the study searched around "
                         "(default: the one configs/hparams_search/<SWEEP_DIR name>.yaml overrides)")
    ap.add_argument("overrides", nargs="*", help="with --command: Hydra overrides added to the trial's")
    args = ap.parse_intermixed_args()
    if args.overrides and args.command is None:
        ap.error("overrides are for --command")
    runs = [d for d in sorted(args.sweep_dir.iterdir()) if (d / "config.yaml").is_file()]
    if not runs:
        raise SystemExit(f"study_table: no trial run directories in {args.sweep_dir}")
    rows = [trial_row(d) for d in runs]
    if (args.sweep_dir / "optuna.db").is_file():
        trial_numbers(f"sqlite:///{args.sweep_dir / 'optuna.db'}", args.study_name or args.sweep_dir.name, rows)
    if args.command is None:
        print(markdown(best_first(rows)))
    else:
        if not (args.sweep_dir / "optuna.db").is_file():
            raise SystemExit(f"study_table: --command needs the study's storage, {args.sweep_dir / 'optuna.db'}")
        overrides = trial_overrides(row_of(args.command, rows), args.experiment or study_experiment(args.sweep_dir),
                                    args.overrides)
        print(" ".join(["mt-train", *map(shlex.quote, overrides)]))
