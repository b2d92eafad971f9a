"""Pieces per line of a test set, clean, upper-cased and title-cased, under each of
several vocabularies: what data.spm_case_copies changes in how text in capitals is cut.

    python scripts/studies/case_pieces.py runs/arms/base/checkpoints/step_2000 \
        runs/arms/augment_cased/checkpoints/step_2000 [--lines 1000]

Each argument is a SentencePiece .model file or a checkpoint directory (its tokenizer.model).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from transformer.data import perturb
from transformer.data.corpus import normalize, read_lines
from transformer.data.tokenizer import TOKENIZER_FILE, Tokenizer
from transformer.paths import PROJECT_ROOT

SETS = ("tatoeba-test", "flores200-devtest", "europarl-test")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("vocabularies", nargs="+", type=Path)
    parser.add_argument("--lines", type=int, default=1000, help="the first N lines of each set")
    parser.add_argument("--eval-dir", type=Path, default=PROJECT_ROOT.parent / "shared" / "data" / "eval")
    args = parser.parse_args()
    tokenizers = [Tokenizer.load(v / TOKENIZER_FILE if v.is_dir() else v) for v in args.vocabularies]
    print("| set | side | text | " + " | ".join(str(v) for v in args.vocabularies) + " |")
    print("|---|---|---|" + "---:|" * len(tokenizers))
    for name in SETS:
        for side in ("it", "en"):
            lines = [normalize(x) for x in read_lines(args.eval_dir / f"{name}.{side}")[: args.lines]]
            for change in ("clean", "upper", "title"):
                text = lines if change == "clean" else [getattr(perturb, change)(x) for x in lines]
                cells = [f"{sum(map(len, t.encode(text))) / len(text):.1f}" for t in tokenizers]
                print(f"| {name} | {side} | {change} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
