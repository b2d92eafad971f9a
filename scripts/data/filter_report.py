"""What each corpus filter (data.filters) removes from a corpus's training pairs: counts,
alone and in preparation's order, and examples (transformer/inspection/filter_report.py).

    python scripts/data/filter_report.py tatoeba
    python scripts/data/filter_report.py files --train-src my.it --train-tgt my.en
    python scripts/data/filter_report.py europarl --langid 0.01 --examples 10 --time
"""

from __future__ import annotations

import argparse
import logging

from transformer.config import DataConfig, FilterConfig
from transformer.errors import UserError
from transformer.inspection.filter_report import filter_report, format_report, preparation_seconds


def threshold(value: str) -> float | None:
    """A rule's number, or `off`."""
    return None if value == "off" else float(value)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("corpus", help="a named corpus (tatoeba | europarl | sample), or files")
    p.add_argument("--root", default="../shared/data", help="where the named corpora lie (data.root)")
    p.add_argument("--train-src", help="corpus files: the source file, or one TSV or JSONL file (data.train_src)")
    p.add_argument("--train-tgt", help="corpus files: the target file of a plain-text pair (data.train_tgt)")
    p.add_argument("--char-ratio", type=threshold, default=3.0, help="data.filters.char_ratio (off: not run)")
    p.add_argument("--no-numbers", action="store_true", help="leave data.filters.numbers off")
    p.add_argument("--script", type=threshold, default=0.1, help="data.filters.script (off: not run)")
    p.add_argument("--langid", type=threshold, default=0.01, help="data.filters.langid (off: not run)")
    p.add_argument("--dedup", default="pairs", type=lambda v: None if v == "off" else v,
                   help="data.filters.dedup in the chain, pairs or target (both modes run alone; off: neither)")
    p.add_argument("--examples", type=int, default=10, help="examples of each rule's removals")
    p.add_argument("--seed", type=int, default=0, help="seed of the examples' sample")
    p.add_argument("--time", action="store_true", help="also time preparation's cleaning pass with and "
                   "without the filters, in data.num_proc=2 worker processes")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    try:
        cfg = FilterConfig(args.char_ratio, not args.no_numbers, args.script, args.langid, args.dedup)
        data = DataConfig(name=args.corpus, root=args.root, train_src=args.train_src,
                          train_tgt=args.train_tgt, filters=cfg)
        data.validate()
        print(format_report(filter_report(data, cfg, args.examples, args.seed)))
        if args.time:
            print(f"Preparation's pass over the training split, data.num_proc={data.num_proc}:\n")
            for label, (wall, cpu) in preparation_seconds(data, cfg).items():
                print(f"- {label}: {wall} s ({cpu} CPU seconds)")
    except UserError as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
