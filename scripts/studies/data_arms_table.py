"""The tables of scripts/studies/data_arms.sh: each arm's scores from mt-evaluate's reports.

    python scripts/studies/data_arms_table.py runs/arms [--step 2000] [--eval-dir outputs/eval]
    python scripts/studies/data_arms_table.py runs/arms --curve    # tatoeba-test by update
    python scripts/studies/data_arms_table.py runs/arms --plot docs/results/data-options-curve.png

Reads every report under --eval-dir whose checkpoint lies in ARMS_DIR/<arm>/checkpoints,
and prints Markdown tables: BLEU on the clean sets (cased, as the recipes are scored), and
case-insensitive BLEU (BLEU-lc) clean and perturbed, with each perturbed score's distance
from the clean one, for the checkpoints of update --step; or with --curve, tatoeba-test's
BLEU-lc clean and perturbed at every update scored.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SETS = {"flores200-devtest": "FLORES", "fl500": "FLORES 500", "eu500": "europarl-test 500",
        "ta1000": "tatoeba-test 1,000"}
VARIANTS = ("clean", "upper", "title", "nopunct", "typos")


def reports(arms_dir: Path, eval_dir: Path) -> dict[tuple[str, str, str, int], dict]:
    """(arm, set, variant, update) -> report, for the reports of checkpoints under arms_dir."""
    arms_dir = arms_dir.resolve()
    found = {}
    for path in sorted(eval_dir.rglob("*.json")):
        try:
            report = json.loads(path.read_text())
            checkpoint = Path(report["checkpoint"])
        except (ValueError, KeyError, TypeError):
            continue
        if not checkpoint.is_relative_to(arms_dir):
            continue
        arm = checkpoint.relative_to(arms_dir).parts[0]
        name = next((label for key, label in SETS.items() if key in str(report["test_set"])), None)
        if name is None:
            continue
        variant = (report.get("perturb") or {}).get("name") or "clean"
        step = checkpoint.name.removeprefix("step_")
        if step.isdigit():
            found[arm, name, variant, int(step)] = report
    return found


def curve(found: dict) -> None:
    name = SETS["ta1000"]
    arms = sorted({k[0] for k in found if k[1] == name})
    variants = [v for v in VARIANTS if any(k[1] == name and k[2] == v for k in found)]
    print(f"**{name}**, BLEU-lc by update (distance from clean)\n")
    print("| arm | update | " + " | ".join(variants) + " |")
    print("|---|---:|" + "---:|" * len(variants))
    for arm in arms:
        for step in sorted({k[3] for k in found if k[0] == arm and k[1] == name}):
            clean = found.get((arm, name, "clean", step))
            cells = []
            for v in variants:
                r = found.get((arm, name, v, step))
                lc = r and r["scores"]["BLEU-lc"]
                gap = f" ({lc - clean['scores']['BLEU-lc']:+.1f})" if r and clean and v != "clean" else ""
                cells.append("" if r is None else f"{lc:.1f}{gap}")
            print(f"| {arm} | {step:,} | " + " | ".join(cells) + " |")


def plot(found: dict, out: Path) -> None:
    """tatoeba-test BLEU-lc by update, clean (solid) and upper-cased (dashed), an arm a colour."""
    from matplotlib.figure import Figure

    name = SETS["ta1000"]
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    for i, arm in enumerate(sorted({k[0] for k in found if k[1] == name})):
        for variant, style in (("clean", "-"), ("upper", "--")):
            points = sorted((k[3], r["scores"]["BLEU-lc"]) for k, r in found.items()
                            if k[0] == arm and k[1] == name and k[2] == variant)
            if points:
                ax.plot(*zip(*points, strict=True), style, marker="o", color=f"C{i}", label=f"{arm}, {variant}")
    ax.set_xlabel("updates")
    ax.set_ylabel(f"{name}: BLEU-lc")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("arms_dir", type=Path)
    parser.add_argument("--eval-dir", type=Path, default=Path("outputs/eval"))
    parser.add_argument("--step", type=int, default=2000, help="the update whose checkpoints are compared")
    parser.add_argument("--curve", action="store_true", help="tatoeba-test at every update scored")
    parser.add_argument("--plot", type=Path, help="draw the curve of tatoeba-test, clean and upper case, here")
    args = parser.parse_args()
    every = reports(args.arms_dir, args.eval_dir)
    if args.plot:
        plot(every, args.plot)
    if args.curve:
        curve(every)
    if args.plot or args.curve:
        return
    found = {k[:3]: r for k, r in every.items() if k[3] == args.step}
    arms = sorted({arm for arm, _, _ in found})
    sets = [s for s in SETS.values() if any(k[1] == s for k in found)]

    print("| arm | " + " | ".join(sets) + " |")
    print("|---|" + "---:|" * len(sets))
    for arm in arms:
        cells = [f"{found[arm, s, 'clean']['scores']['BLEU']:.1f}" if (arm, s, "clean") in found else ""
                 for s in sets]
        print(f"| {arm} | " + " | ".join(cells) + " |")
    print()
    for s in sets:
        variants = [v for v in VARIANTS if any(k[1] == s and k[2] == v for k in found)]
        print(f"**{s}**, BLEU-lc (distance from clean)\n")
        print("| arm | " + " | ".join(variants) + " |")
        print("|---|" + "---:|" * len(variants))
        for arm in arms:
            clean = found.get((arm, s, "clean"))
            cells = []
            for v in variants:
                r = found.get((arm, s, v))
                if r is None:
                    cells.append("")
                    continue
                lc = r["scores"]["BLEU-lc"]
                gap = f" ({lc - clean['scores']['BLEU-lc']:+.1f})" if clean and v != "clean" else ""
                cells.append(f"{lc:.1f}{gap}")
            print(f"| {arm} | " + " | ".join(cells) + " |")
        print()


if __name__ == "__main__":
    main()
