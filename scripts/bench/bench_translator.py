"""`Translator.translate` speed on a CPU: the library face, timed as a user would call it.

For comparing two checkouts back to back (the same script, the other package first on
PYTHONPATH), so it uses only what every `Translator` has: `Translator.load(path)` and
`translate(lines, **settings)`. It prints sentences/s of the translate calls (not the
process's start or the load) and the CPU.

    python scripts/bench/bench_translator.py --make /tmp/bench_ckpt           # a random small model
    python scripts/bench/bench_translator.py /tmp/bench_ckpt --lines 200 --method greedy
    python scripts/bench/bench_translator.py /tmp/bench_ckpt --with return_scores=True   # a keyword
    PYTHONPATH=../other-checkout python scripts/bench/bench_translator.py /tmp/bench_ckpt

`--make DIR` writes a checkpoint of a randomly initialised small model
(configs/model/small.yaml, seed 0) with a SentencePiece model trained on data/sample: a
random model writes to the length limit, the same work for every checkout. The lines are
the first `--lines` of tatoeba-test (the shared data), else of data/sample's dev set.
"""

from __future__ import annotations

import argparse
import ast
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT.parent / "shared" / "data" / "eval" / "tatoeba-test.it",
           Path("/work/shared/data/eval/tatoeba-test.it"), ROOT / "data" / "sample" / "dev.it"]


def make(out: Path) -> None:
    import dataclasses

    import torch

    from transformer.checkpoint import save_checkpoint
    from transformer.config import ModelConfig, load_preset, to_dataclass
    from transformer.data.corpus import read_lines
    from transformer.data.tokenizer import train_tokenizer
    from transformer.model.transformer import build_model

    sample = ROOT / "data" / "sample"
    tokenizer = train_tokenizer(read_lines(sample / "train.it") + read_lines(sample / "train.en"),
                                vocab_size=500)
    cfg = to_dataclass(ModelConfig, load_preset(ModelConfig, ROOT / "configs" / "model" / "small.yaml"))
    torch.manual_seed(0)
    model = build_model(dataclasses.replace(cfg, vocab_size=tokenizer.vocab_size))
    print(save_checkpoint(out, model, tokenizer, "", {}))


def keyword(item: str) -> tuple[str, object]:
    """`--with KEY=VALUE` as (key, the Python literal VALUE); a one-line error otherwise."""
    key, sep, value = item.partition("=")
    try:
        if not sep or not key.isidentifier():
            raise ValueError
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        raise argparse.ArgumentTypeError(f"{item!r}: give KEY=VALUE, VALUE a Python literal "
                                         "(return_scores=True, method='beam')") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", nargs="?", help="a checkpoint directory")
    parser.add_argument("--make", type=Path, help="write a random small-model checkpoint here and stop")
    parser.add_argument("--lines", type=int, default=200)
    parser.add_argument("--method", default="greedy", choices=["greedy", "beam"])
    parser.add_argument("--repeats", type=int, default=1, help="translate calls, each timed")
    parser.add_argument("--with", dest="keywords", action="append", default=[], metavar="KEY=VALUE",
                        type=keyword,
                        help="a keyword for translate (a Python literal: return_scores=True, "
                             "no_repeat_ngram_size=3); repeatable")
    args = parser.parse_args()
    if args.make:
        make(args.make)
        return
    from transformer import Translator
    from transformer.data.corpus import read_lines
    from transformer.device import describe_cpu

    source = next(p for p in SOURCES if p.is_file())
    lines = read_lines(source)[: args.lines]
    keywords = dict(args.keywords)
    translator = Translator.load(args.checkpoint, device="cpu")
    translator.translate(lines[:4], method=args.method, **keywords)  # warm-up
    for _ in range(args.repeats):
        start = time.perf_counter()
        out = translator.translate(lines, method=args.method, **keywords)
        seconds = time.perf_counter() - start
        print(f"{len(out)} lines, {args.method} {keywords or ''}: {seconds:.2f} s, "
              f"{len(out) / seconds:.1f} sent/s ({describe_cpu()}, {source.name})")


if __name__ == "__main__":
    main()
