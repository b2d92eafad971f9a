"""Time the assembly of one training batch on the host: from the dataset's rows as Python
lists (`collate(dataset[rows])`, what the prefetch thread did) against the flat numpy
arrays read once from the Arrow buffers (`TokenIds.collate_rows`, what it does).

    python scripts/bench/bench_batching.py                      # Europarl-like, ~12k target tokens
    python scripts/bench/bench_batching.py --pairs 200000 --max-tokens 16384 --repeat 50

The corpus is synthetic (lengths drawn like Europarl's, ~30 tokens a side, ids below 8,000),
saved with `datasets` and loaded back memory-mapped as prepared data is. Batches are the
trainer's (`TokenBatchSampler`, `data.max_tokens`); the median over batches is printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import datasets
import numpy as np

from transformer.data.batching import TokenBatchSampler, TokenIds, collate

PAD, BOS, EOS, VOCAB = 0, 2, 3, 8000


def corpus(n: int, seed: int = 0) -> dict[str, list[list[int]]]:
    rng = np.random.default_rng(seed)
    src = np.clip(rng.gamma(3.0, 10.0, n).astype(int) + 1, 1, 200)
    tgt = np.clip((src * rng.uniform(0.8, 1.25, n)).astype(int), 1, 200)
    return {"src_ids": [rng.integers(4, VOCAB, k).tolist() for k in src],
            "tgt_ids": [rng.integers(4, VOCAB, k).tolist() for k in tgt]}


def median_ms(fn, batches) -> float:
    times = []
    for rows in batches:
        t0 = time.perf_counter()
        fn(rows)
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=100_000)
    ap.add_argument("--max-tokens", type=int, default=16384, help="data.max_tokens (the GPU recipe's)")
    ap.add_argument("--repeat", type=int, default=30, help="batches timed")
    ap.add_argument("--pad-to-multiple", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        datasets.Dataset.from_dict(corpus(args.pairs)).save_to_disk(tmp)
        dataset = datasets.load_from_disk(tmp)
        t0 = time.perf_counter()
        ids = TokenIds(dataset, VOCAB)
        read_s = time.perf_counter() - t0
        sampler = TokenBatchSampler(*ids.lengths(), max_tokens=args.max_tokens, seed=1,
                                    pad_to_multiple=args.pad_to_multiple)
        plan = sampler.batches(0)
        batches = [plan.rows_of(i) for i in range(min(args.repeat, len(plan)))]
        lists = median_ms(lambda rows: collate(dataset[rows.tolist()], PAD, BOS, EOS, args.pad_to_multiple, VOCAB),
                          batches)
        arrays = median_ms(lambda rows: ids.collate_rows(rows, PAD, BOS, EOS, args.pad_to_multiple, VOCAB),
                           batches)
        tokens = statistics.median(int(ids.lengths()[1][rows].sum()) + len(rows) for rows in batches)
    result = {"pairs": args.pairs, "max_tokens": args.max_tokens, "median_target_tokens": tokens,
              "python_lists_ms": round(lists, 2), "arrow_arrays_ms": round(arrays, 2),
              "speedup": round(lists / arrays, 1), "token_ids_read_s": round(read_s, 2)}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
