"""Cross-attention heatmap of a sentence's greedy translation, as a PNG.

    python scripts/plots/plot_attention.py --checkpoint runs/tatoeba_cpu/checkpoints/best \
        --sentence "Ci vediamo martedì alle due." --output attention.png [--layer -1]
"""

from __future__ import annotations

import argparse
import sys

from transformer.checkpoint import CheckpointError, load_model
from transformer.inspection.attention_plots import cross_attention, plot_alignment


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="a checkpoint directory")
    parser.add_argument("--sentence", required=True, help="the Italian sentence")
    parser.add_argument("--output", default="attention.png", help="the PNG to write")
    parser.add_argument("--layer", type=int, default=-1, help="decoder layer (default: last)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    try:
        model, tokenizer = load_model(args.checkpoint, args.device)
        alignment = cross_attention(model, tokenizer, args.sentence, args.layer)
    except (CheckpointError, ValueError) as e:
        sys.exit(f"plot_attention: error: {e}")
    path = plot_alignment(alignment, args.output)
    print(f"{args.sentence}\n-> {alignment.translation}\nwrote {path}")


if __name__ == "__main__":
    main()
