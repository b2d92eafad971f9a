"""A sentence pair's way through the package, as a picture (docs/dataflow.png).

    python scripts/plots/plot_dataflow.py                      # writes docs/dataflow.png
    python scripts/plots/plot_dataflow.py --out /tmp/flow.png  # elsewhere

From corpus files on disk to LibreTranslate's answer, one box per step, named by the
module that does it and coloured by that module's layer (scripts/plots/import_graph.py's
LAYERS, the colours of docs/architecture.png). The steps are written here, the modules
are checked against the code each time: a step whose module moved or vanished stops the
script, so the picture cannot name a module that is not there.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from import_graph import LAYERS, group, read_graph
from plot_architecture import COLOURS

ROOT = Path(__file__).resolve().parents[2]

# (what happens, the module that does it or None for data at rest, column, row); rows from
# the top: preparation, training, deployment; mt-translate's way branches off the checkpoint.
STEPS = {
    "files": ("corpus files\n(plain, .gz; Tatoeba,\nEuroparl, the hub)", None, 0, 0),
    "read": ("read pairs as a stream", "transformer.data.corpus", 1, 0),
    "clean": ("clean and hash in chunks\n→ Arrow CleanSplit", "transformer.data.clean_split", 2, 0),
    "spm": ("train the joint\nSentencePiece model", "transformer.data.tokenizer", 3, 0),
    "encode": ("encode into ids,\nfilter by length", "transformer.data.encode_split", 4, 0),
    "cache": ("prepared cache\nprepared-<key>/\n(prepare_data)", "transformer.data.pipeline", 5, 0),
    "batch": ("token batches\nbucketed by length", "transformer.data.batching", 5, 1),
    "train": ("updates, validation,\nwhen to save", "transformer.training.trainer", 4, 1),
    "ckpt": ("checkpoint directory\n(safetensors, tokenizer,\nconfigs)", "transformer.checkpoint", 3, 1),
    "text": ("mt-translate: split,\nencode, batch, search,\nrejoin", "transformer.decoding.text", 2, 1),
    "search": ("greedy / beam search\non the KV cache", "transformer.decoding.search", 1, 1),
    "out": ("English lines", None, 0, 1),
    "export": ("CTranslate2 model\n(int8 if asked)", "transformer.deploy.ct2_export", 3, 2),
    "argos": ("Argos package\n(.argosmodel)", "transformer.deploy.argos", 2, 2),
    "serve": ("LibreTranslate: fair\nbatches, bounded requests", "transformer.deploy.serving", 1, 2),
    "answer": ("HTTP answer\non 127.0.0.1", None, 0, 2),
}
ARROWS = [("files", "read"), ("read", "clean"), ("clean", "spm"), ("spm", "encode"),
          ("encode", "cache"), ("cache", "batch"), ("batch", "train"), ("train", "ckpt"),
          ("ckpt", "text"), ("text", "search"), ("search", "out"), ("ckpt", "export"),
          ("export", "argos"), ("argos", "serve"), ("serve", "answer")]
COMMANDS = {"read": "mt-prepare", "train": "mt-train", "text": "mt-translate / Translator",
            "export": "mt-export", "argos": "mt-export format=argos",
            "serve": "serve_libretranslate.sh"}


def check_modules(root: Path) -> None:
    """Every module a step names is in the package and in a layer."""
    modules = set(read_graph(root).modules)
    missing = [m for _, m, _, _ in STEPS.values() if m and (m not in modules or group(m) not in LAYERS)]
    if missing:
        raise SystemExit(f"plot_dataflow: not in the package (moved? renamed?): {', '.join(missing)}")


def draw(out: Path) -> None:
    w, h, dx, dy = 2.5, 1.5, 3.1, 2.5  # a box, and the distance between boxes
    fig, ax = plt.subplots(figsize=(15.5, 8.2))
    ax.set_xlim(-0.3, 6 * dx - 0.3)
    ax.set_ylim(-3 * dy + 0.4, 1.4)
    ax.axis("off")
    centre = {k: (col * dx + w / 2, -row * dy) for k, (_, _, col, row) in STEPS.items()}
    for key, (what, module, _, _) in STEPS.items():
        x, y = centre[key]
        colour = "white" if module is None else COLOURS[LAYERS[group(module)] % len(COLOURS)]
        ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02,rounding_size=0.12",
                                    facecolor=colour, edgecolor="#34495e", linewidth=1.2,
                                    linestyle="-" if module else "--", zorder=2))
        ax.text(x, y + 0.18, what, ha="center", va="center", fontsize=8.6, zorder=3)
        if module:
            ax.text(x, y - h / 2 + 0.2, module.removeprefix("transformer.").replace(".", "/") + ".py",
                    ha="center", va="center", fontsize=7.6, family="monospace", color="#1b2631", zorder=3)
        if key in COMMANDS:
            ax.text(x, y + h / 2 + 0.16, COMMANDS[key], ha="center", va="center", fontsize=7.8,
                    color="#7b241c", style="italic", zorder=3)
    for a, b in ARROWS:
        (xa, ya), (xb, yb) = centre[a], centre[b]
        if ya == yb:  # along a row
            sign = 1 if xb > xa else -1
            start, end = (xa + sign * w / 2, ya), (xb - sign * w / 2, yb)
        else:  # down a column, or down and across
            start, end = (xa, ya - h / 2), (xb, yb + h / 2 + (0.3 if b in COMMANDS else 0))
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14,
                                     color="#2c3e50", linewidth=1.5, zorder=1))
    legend = [("layer 1: data", COLOURS[1]), ("layer 2: checkpoint", COLOURS[2]),
              ("layer 3: decoding", COLOURS[3]), ("layer 4: training, deploy", COLOURS[4])]
    for i, (label, colour) in enumerate(legend):
        x = i * 3.6
        ax.add_patch(FancyBboxPatch((x, -3 * dy + 0.55), 0.35, 0.3, boxstyle="square,pad=0",
                                    facecolor=colour, edgecolor="#34495e"))
        ax.text(x + 0.5, -3 * dy + 0.7, label, va="center", fontsize=8.5)
    ax.set_title("From corpus files to a served translation: each step and the module that does it "
                 "(colour: its layer; dashed: data at rest)", fontsize=10.5, loc="left")
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "dataflow.png")
    args = parser.parse_args(argv)
    check_modules(ROOT)
    draw(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
