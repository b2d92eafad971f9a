"""Time the assembly of one training batch on the host: from the dataset's rows as Python
lists (`collate(dataset[rows])`, what the prefetch thread did) against the flat numpy
arrays read once from the Arrow buffers (`TokenIds.collate_rows`, what it does).

    python scripts/bench/bench_batching.py                      # Europarl-like, ~12k target tokens
    python scripts/bench/bench_batching.py --pairs 200000 --max-tokens 16384 --repeat 50
    python scripts/bench/bench_batching.py --segmentations 4    # with subword sampling's rows
    python scripts/bench/bench_batching.py --prepared data/cache/prepared-<key> --max-tokens 4096
    python scripts/bench/bench_batching.py --prepared data/cache/prepared-<key> --max-tokens 4096 \
        --pad-to-multiple 1 --augment upper=0.1,title=0.1,nopunct=0.1,typos=0.1,merge=0.05

The corpus is synthetic (lengths drawn like Europarl's, ~30 tokens a side, ids below 8,000),
saved with `datasets` and loaded back memory-mapped as prepared data is. Batches are the
trainer's (`TokenBatchSampler`, `data.max_tokens`); the median over batches is printed,
with the time to plan an epoch's batches, the pairs a batch holds and its padding efficiency.
With `--segmentations K` the sources have K segmentations each, as subword sampling keeps
them (`data.subword_sampling`: each 1.1-1.6x the best one's length, as SentencePiece's
sampling at alpha 0.1 makes them), and an epoch takes one of each pair's.

With `--prepared` (a folder of the prepared-data cache: real text, its tokenizer) and
`--augment` (data.augment's probabilities), it times instead a batch without and with
data.augment (`Augmenter.pieces`: the draws, the changed pairs re-encoded, the pieces
collated), the mean over the batches of an epoch's start, and how often a batch is cut.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import datasets
import numpy as np

from transformer.config import AugmentConfig
from transformer.data.augment import Augmenter
from transformer.data.batching import TokenBatchSampler, TokenIds, collate, padding_efficiency
from transformer.data.prepared_cache import open_prepared

PAD, BOS, EOS, VOCAB = 0, 2, 3, 8000


def corpus(n: int, seed: int = 0) -> dict[str, list[list[int]]]:
    rng = np.random.default_rng(seed)
    src = np.clip(rng.gamma(3.0, 10.0, n).astype(int) + 1, 1, 200)
    tgt = np.clip((src * rng.uniform(0.8, 1.25, n)).astype(int), 1, 200)
    return {"src_ids": [rng.integers(4, VOCAB, k).tolist() for k in src],
            "tgt_ids": [rng.integers(4, VOCAB, k).tolist() for k in tgt]}


def segmentations(src_ids: list[list[int]], k: int, seed: int = 1) -> dict[str, list[list[list[int]]]]:
    """K segmentations of each source, 1.1-1.6x as long (at most 200 tokens)."""
    rng = np.random.default_rng(seed)
    return {"src_samples": [[rng.integers(4, VOCAB, min(200, int(len(ids) * rng.uniform(1.1, 1.6)))).tolist()
                             for _ in range(k)] for ids in src_ids]}


def median_ms(fn, batches) -> float:
    times = []
    for rows in batches:
        t0 = time.perf_counter()
        fn(rows)
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def mean_ms(fn, batches) -> float:
    t0 = time.perf_counter()
    for rows in batches:
        fn(rows)
    return 1e3 * (time.perf_counter() - t0) / len(batches)


def bench_augment(args) -> dict:
    """A batch of a prepared corpus collated plainly and with data.augment (`args.augment`)."""
    prepared = open_prepared(Path(args.prepared))
    if prepared is None:
        raise SystemExit(f"--prepared {args.prepared}: no prepared data there (no meta.json)")
    tok = prepared.tokenizer
    probabilities = dict(item.split("=") for item in args.augment.split(","))
    cfg = AugmentConfig(**{k: float(v) for k, v in probabilities.items()})
    ids = TokenIds(prepared.train, tok.vocab_size)
    plan = TokenBatchSampler(*ids.lengths(), max_tokens=args.max_tokens, seed=1,
                             pad_to_multiple=args.pad_to_multiple).batches(0)
    batches = [plan.rows_of(i) for i in range(min(args.repeat, len(plan)))]
    augmenter = Augmenter(cfg, 1, prepared.train, tok, 128, args.max_tokens, args.pad_to_multiple)
    plain = mean_ms(lambda rows: ids.collate_rows(rows, tok.pad_id, tok.bos_id, tok.eos_id, args.pad_to_multiple,
                                                  tok.vocab_size), batches)
    augmented = mean_ms(lambda rows: augmenter.pieces(ids, rows, 0, tok.vocab_size), batches)
    pieces = [len(augmenter.pieces(ids, rows, 0, tok.vocab_size)) for rows in batches]
    return {"prepared": args.prepared, "pairs": len(ids), "max_tokens": args.max_tokens, "augment": probabilities,
            "batches": len(batches), "mean_pairs_per_batch": round(statistics.mean(map(len, batches)), 1),
            "plain_ms": round(plain, 2), "augmented_ms": round(augmented, 2),
            "batches_cut_in_pieces": round(sum(p > 1 for p in pieces) / len(pieces), 3),
            "mean_pieces": round(statistics.mean(pieces), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=100_000)
    ap.add_argument("--max-tokens", type=int, default=16384, help="data.max_tokens (the GPU recipe's)")
    ap.add_argument("--repeat", type=int, default=30, help="batches timed")
    ap.add_argument("--pad-to-multiple", type=int, default=8)
    ap.add_argument("--segmentations", type=int, default=1, help="subword sampling's segmentations per pair")
    ap.add_argument("--prepared", help="a prepared-data folder (data/cache/prepared-*) to time instead of "
                                       "a synthetic corpus; its own segmentations")
    ap.add_argument("--augment", help="with --prepared: time data.augment's probabilities, as name=p,name=p")
    args = ap.parse_args()
    if args.augment:
        if not args.prepared:
            raise SystemExit("--augment needs --prepared (a prepared-data folder: its text and tokenizer)")
        print(json.dumps(bench_augment(args), indent=1))
        return
    with tempfile.TemporaryDirectory() as tmp:
        if args.prepared:
            prepared = open_prepared(Path(args.prepared))
            if prepared is None:
                raise SystemExit(f"--prepared {args.prepared}: no prepared data there")
            dataset, samples, k, vocab = prepared.train, prepared.samples, prepared.segmentations, \
                prepared.tokenizer.vocab_size
        else:
            dataset, samples, k, vocab = *synthetic(tmp, args.pairs, args.segmentations), args.segmentations, VOCAB
        result = measure(dataset, samples, k, vocab, args)
    print(json.dumps(result, indent=1))


def synthetic(tmp: str, n: int, k: int):
    """The synthetic corpus saved and loaded back memory-mapped, and its sources' K
    segmentations (None for K = 1)."""
    pairs = corpus(n)
    datasets.Dataset.from_dict(pairs).save_to_disk(f"{tmp}/train")
    if k == 1:
        return datasets.load_from_disk(f"{tmp}/train"), None
    datasets.Dataset.from_dict(segmentations(pairs["src_ids"], k)).save_to_disk(f"{tmp}/samples")
    return datasets.load_from_disk(f"{tmp}/train"), datasets.load_from_disk(f"{tmp}/samples")


def measure(dataset, samples, k: int, vocab: int, args) -> dict:
    """Read the ids, plan an epoch, time the batches both ways."""
    t0 = time.perf_counter()
    ids = TokenIds(dataset, vocab, samples, k)
    read_s = time.perf_counter() - t0
    sampler = TokenBatchSampler(*ids.lengths(), max_tokens=args.max_tokens, seed=1,
                                pad_to_multiple=args.pad_to_multiple, segmentations=k)
    sampler.batches(0)
    t0 = time.perf_counter()
    plan = sampler.batches(1)  # an epoch whose plan is not cached yet
    plan_s = time.perf_counter() - t0
    batches = [plan.rows_of(i) for i in range(min(args.repeat, len(plan)))]
    lists = median_ms(lambda rows: collate(_rows(dataset, samples, rows, k), PAD, BOS, EOS, args.pad_to_multiple,
                                           vocab), batches)
    arrays = median_ms(lambda rows: ids.collate_rows(rows, PAD, BOS, EOS, args.pad_to_multiple, vocab), batches)
    tokens = statistics.median(int(ids.lengths()[1][rows].sum()) + len(rows) for rows in batches)
    return {"pairs": len(dataset), "segmentations": k, "max_tokens": args.max_tokens,
            "median_target_tokens": tokens, "python_lists_ms": round(lists, 2), "arrow_arrays_ms": round(arrays, 2),
            "speedup": round(lists / arrays, 1), "token_ids_read_s": round(read_s, 2),
            "plan_epoch_s": round(plan_s, 3), "batches_per_epoch": len(plan),
            "pairs_per_batch": round(len(plan.rows) / len(plan), 1),
            "padding_efficiency": round(padding_efficiency(plan, *ids.lengths()), 4)}


def _rows(dataset, samples, rows, k: int) -> dict[str, list]:
    """The rows as `datasets` gives them as Python lists: with K segmentations, row
    `pair * K + j` is the pair's target and its j-th sampled source."""
    if samples is None:
        return dataset[rows.tolist()]
    pairs = (rows // k).tolist()
    return {"src_ids": [s[j] for s, j in zip(samples[pairs]["src_samples"], (rows % k).tolist(), strict=True)],
            "tgt_ids": dataset[pairs]["tgt_ids"]}


if __name__ == "__main__":
    main()
