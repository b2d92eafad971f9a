"""Learning curves of a run (dev BLEU/chrF and losses against training time) as a PNG, or
several runs compared (dev BLEU and NLL, one colour per run).

    python scripts/plots/plot_learning_curve.py runs/tatoeba_cpu docs/tatoeba_cpu_curve.png
    python scripts/plots/plot_learning_curve.py runs/a runs/b -o compare.png --labels "1:1" "3:1"
    python scripts/plots/plot_learning_curve.py runs/scratch runs/stage1+runs/stage2 -o c.png --x updates
"""

import argparse

from transformer.inspection.learning_curves import plot_learning_curves, plot_run_comparison

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help="a run directory (holding tb/) and the PNG to write; "
                    "or, with -o, the run directories to compare")
    ap.add_argument("-o", "--out", default=None, help="compare the runs given into this PNG")
    ap.add_argument("--labels", nargs="+", default=None, help="a legend label per compared run")
    ap.add_argument("--title", default=None)
    ap.add_argument("--x", choices=("hours", "updates"), default="hours",
                    help="the compared runs' x axis (a chain `a+b` continues b where a ended)")
    args = ap.parse_args()
    if args.out:
        print(plot_run_comparison(args.paths, args.out, args.labels, args.title, args.x))
    elif len(args.paths) == 2:
        print(plot_learning_curves(args.paths[0], args.paths[1], args.title))
    else:
        ap.error("give RUN_DIR OUT_PNG, or RUN_DIR... -o OUT_PNG to compare runs")
