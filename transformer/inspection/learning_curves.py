"""Learning curves from a run's TensorBoard logs: dev BLEU and losses against training time.

Reads the event files of `<run_dir>/tb` (every resumed segment of the run), so the picture
needs nothing but the run directory. Matplotlib's object API with the Agg canvas.
"""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path

import yaml
from matplotlib.figure import Figure
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[float, int, float]]]:
    """tag -> [(wall_time, step, value)] over all event files of run_dir/tb, by step.

    A resumed run repeats no step, but a step logged twice (a crash between a log line
    and the next checkpoint) keeps its latest value.
    """
    tb = Path(run_dir) / "tb"
    files = sorted(tb.glob("events.out.tfevents.*"))
    if not files:
        raise FileNotFoundError(f"no TensorBoard event files in {tb}")
    series: dict[str, dict[int, tuple[float, int, float]]] = {}
    for f in files:
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            for e in acc.Scalars(tag):  # by wall time: file names do not order resumed segments
                known = series.setdefault(tag, {}).get(e.step)
                if known is None or e.wall_time >= known[0]:
                    series[tag][e.step] = (e.wall_time, e.step, e.value)
    return {tag: [v[s] for s in sorted(v)] for tag, v in series.items()}


def training_hours(scalars: dict[str, list[tuple[float, int, float]]]) -> dict[int, float]:
    """step -> hours of training. The trainer's own clock where the run logged it at every
    log step (`train/hours`: what `trainer.max_hours` counts, without validation,
    checkpoints and restarts). Older runs: the wall times of `train/loss`, without the
    pauses between resumed segments (an interval between two logs longer than four typical
    ones, their median, or than 10 minutes, counts as one typical interval), so validation
    and checkpoints are in it."""
    points = scalars["train/loss"]
    clock = {step: value for _, step, value in scalars.get("train/hours", [])}
    if clock and all(step in clock for _, step, _ in points):
        return clock
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(points)]
    typical = statistics.median_high(gaps) if gaps else 0.0
    hours, total = {}, 0.0
    for (_, step, _), gap in zip(points, [0.0, *gaps], strict=True):
        total += gap if gap <= min(4 * typical, 600) else typical
        hours[step] = total / 3600
    return hours


def _hours_at(step: int, hours: dict[int, float]) -> float:
    known = [s for s in hours if s <= step]
    return hours[max(known)] if known else 0.0


def _series(scalars: dict, tag: str, hours: dict[int, float]) -> tuple[list[float], list[float]]:
    """(hours, values) of one logged tag, for plotting against training time."""
    return [_hours_at(s, hours) for _, s, _ in scalars[tag]], [v for _, _, v in scalars[tag]]


def _save(fig: Figure, title: str, out_png: str | Path, legend_size: str = "medium") -> Path:
    """Finish `fig` (grid, legend, title) and write it, making the folder if need be."""
    for ax in fig.axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=legend_size)
    fig.suptitle(title)
    fig.tight_layout()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png)
    return out_png


def dev_sets(scalars: dict) -> list[str]:
    """Names of the dev sets a run validated on separately (`dev/<name>/bleu`), if several."""
    return sorted(tag.split("/")[1] for tag in scalars if tag.startswith("dev/") and tag.count("/") == 2
                  and tag.endswith("/bleu"))


def plot_learning_curves(run_dir: str | Path, out_png: str | Path, title: str | None = None) -> Path:
    """Write a two-panel PNG: dev BLEU/chrF (left) and train/dev loss (right) against hours.

    A run on a mix of corpora gets one BLEU and one loss line per dev set, and the mean
    BLEU that selected its best checkpoint.
    """
    scalars = read_scalars(run_dir)
    hours = training_hours(scalars)
    fig = Figure(figsize=(11, 4.2), dpi=110)
    left, right = fig.subplots(1, 2)
    names = dev_sets(scalars)
    if names:
        score_tags = [(f"dev/{n}/bleu", f"{n} dev BLEU (greedy)") for n in names]
        score_tags.append(("dev/bleu", "mean dev BLEU (selects best)"))
        loss_tags = [("train/loss", "train loss (smoothed CE)")]
        loss_tags += [(f"dev/{n}/nll", f"{n} dev NLL") for n in names]
    else:
        score_tags = [("dev/bleu", "dev BLEU (greedy)"), ("dev/chrf", "dev chrF")]
        loss_tags = [("train/loss", "train loss (smoothed CE)"), ("dev/loss", "dev loss (smoothed CE)"),
                     ("dev/nll", "dev NLL")]
    for tag, label in score_tags:
        if tag in scalars:
            style = {"ls": "--", "color": "black"} if names and tag == "dev/bleu" else {}
            left.plot(*_series(scalars, tag, hours), marker="o", ms=3, label=label, **style)
    left.set(xlabel="training time (hours)", ylabel="score", title="dev scores")
    for tag, label in loss_tags:
        if tag in scalars:
            right.plot(*_series(scalars, tag, hours), lw=1 if tag.startswith("train") else 2,
                       label=label, alpha=0.6 if tag.startswith("train") else 1.0)
    right.set(xlabel="training time (hours)", ylabel="nats per target token", title="loss")
    right.set_ylim(top=min(8.0, right.get_ylim()[1]))
    last_step = scalars["train/loss"][-1][1]
    return _save(fig, title or f"{Path(run_dir).name}: {last_step} updates", out_png)


def _single_dev_name(run_dir: Path) -> str:
    """The corpus a run with one dev set validated on (its config's `data.name`), or ""."""
    config = run_dir / "config.yaml"
    data = (yaml.safe_load(config.read_text()) or {}).get("data") if config.is_file() else None
    name = (data or {}).get("name", "")
    return "" if name in ("files", "mix") else str(name)


def _chain_series(stages: list[Path], metrics: tuple[str, ...], x: str) -> dict[tuple[str, str], tuple[list, list]]:
    """(metric, dev set name) -> (x values, values) over a chain of runs, each stage's x
    (training hours, or updates) continuing from where the previous stage ended."""
    out: dict[tuple[str, str], tuple[list, list]] = {}
    offset = 0.0
    for run_dir in stages:
        scalars = read_scalars(run_dir)
        hours = training_hours(scalars)

        def at(step: int, offset: float = offset, hours: dict = hours) -> float:
            return offset + (_hours_at(step, hours) if x == "hours" else step)

        names = dev_sets(scalars)
        for metric in metrics:
            tags = {n: f"dev/{n}/{metric}" for n in names} if names else {_single_dev_name(run_dir): f"dev/{metric}"}
            for name, tag in tags.items():
                if tag in scalars:
                    xs, ys = out.setdefault((metric, name), ([], []))
                    xs += [at(step) for _, step, _ in scalars[tag]]
                    ys += [value for _, _, value in scalars[tag]]
        offset = at(scalars["train/loss"][-1][1])
    return out


def _stages(run: str | Path) -> list[Path]:
    """A run directory, or a chain `a+b` of them (a `+` inside an existing path is kept)."""
    return [Path(run)] if Path(run).exists() else [Path(p) for p in str(run).split("+")]


def plot_run_comparison(run_dirs: list[str | Path], out_png: str | Path, labels: list[str] | None = None,
                        title: str | None = None, x: str = "hours") -> Path:
    """Write a PNG comparing runs: dev BLEU (left) and dev NLL (right) against training
    hours (or `x="updates"`), one colour per run and one line style per dev set (a
    sweep's picture). A run given as `a+b` is a chain, e.g. a fine-tuning run `b` of a
    checkpoint of `a`: drawn as one run, `b` continuing where `a` ended."""
    labels = labels or [_stages(d)[-1].name for d in run_dirs]
    if len(labels) != len(run_dirs):
        raise ValueError(f"{len(run_dirs)} runs but {len(labels)} labels")
    fig = Figure(figsize=(11, 4.2), dpi=110)
    left, right = fig.subplots(1, 2)
    styles = itertools.cycle(["-", "--", ":", "-."])
    style_of: dict[str, str] = {}
    for i, (run_dir, label) in enumerate(zip(run_dirs, labels, strict=True)):
        axes = {"bleu": left, "nll": right}
        for (metric, name), (xs, ys) in sorted(_chain_series(_stages(run_dir), tuple(axes), x).items()):
            if name not in style_of:  # a style per dev set, the same in every run
                style_of[name] = next(styles)
            suffix = f" {name}" if name else ""
            axes[metric].plot(xs, ys, ls=style_of[name], color=f"C{i}", marker="o", ms=3, label=f"{label}{suffix}")
    xlabel = "training time (hours)" if x == "hours" else "updates"
    left.set(xlabel=xlabel, ylabel="BLEU", title="dev BLEU (greedy)")
    right.set(xlabel=xlabel, ylabel="nats per target token", title="dev NLL")
    return _save(fig, title or " vs ".join(labels), out_png, legend_size="small")
