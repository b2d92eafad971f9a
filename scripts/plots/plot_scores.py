"""Test-set BLEU of a model's checkpoints as a curve: one line per test set, one point per
`mt-evaluate` output folder (its `<test set>.<method>.json` files), placed at the x value
given for it (updates, hours). For what dev BLEU cannot show, e.g. what fine-tuning on
one corpus costs on the others' test sets.

    python scripts/plots/plot_scores.py outputs/parent outputs/ft/step_250 outputs/ft/step_500 \
        --x 0 250 500 --xlabel "Tatoeba updates" -o docs/forgetting.png
"""

import argparse
import json
from pathlib import Path

from matplotlib.figure import Figure


def read_scores(folder: Path, metric: str) -> dict[str, float]:
    """test set -> score, from the mt-evaluate reports in `folder`."""
    out = {}
    for f in sorted(folder.glob("*.json")):
        report = json.loads(f.read_text())
        out[report["test_set"]] = report["scores"][metric]
    if not out:
        raise SystemExit(f"plot_scores: no mt-evaluate report (*.json) in {folder}")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", type=Path, help="mt-evaluate output folders, in order")
    ap.add_argument("--x", nargs="+", type=float, required=True, help="the x value of each folder")
    ap.add_argument("--xlabel", default="updates")
    ap.add_argument("--metric", default="BLEU", help="BLEU | chrF2 | TER | names")
    ap.add_argument("--title", default=None)
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args()
    if len(args.x) != len(args.folders):
        ap.error(f"{len(args.folders)} folders but {len(args.x)} x values")
    scores = [read_scores(f, args.metric) for f in args.folders]
    fig = Figure(figsize=(6, 4), dpi=110)
    ax = fig.subplots()
    for name in sorted(set().union(*scores)):
        points = [(x, s[name]) for x, s in zip(args.x, scores, strict=True) if name in s]
        ax.plot(*zip(*points, strict=True), marker="o", label=name)
    ax.set(xlabel=args.xlabel, ylabel=args.metric, title=args.title or f"test-set {args.metric}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out)
    print(args.out)
