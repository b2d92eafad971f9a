"""Learning curves of a run (dev BLEU/chrF and losses against training time) as a PNG.

    python scripts/plot_learning_curve.py runs/tatoeba_cpu docs/tatoeba_cpu_curve.png
"""

import argparse

from transformer.curves import plot_learning_curves

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", help="a run directory holding tb/ event files")
    ap.add_argument("out_png")
    ap.add_argument("--title", default=None)
    args = ap.parse_args()
    print(plot_learning_curves(args.run_dir, args.out_png, args.title))
