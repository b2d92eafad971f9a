"""Decoding speed: cached greedy and beam search against naive re-decoding of the prefix.

"Naive" is what `torch.nn.Transformer` users usually write: at every step the whole
decoder re-runs over BOS + all tokens so far (`use_cache=False` in transformer/decoding/search.py),
projecting only the last position onto the vocabulary. "Cached" feeds one new token per
step and keeps every layer's keys and values (transformer/model/transformer.py's DecoderCache).

Two regimes, in one process: length-sorted batches of at most --max-tokens source tokens
(translating a file, mt-translate's default), and one sentence at a time (interactive
use) on --single of the same sentences, evenly spaced so every length is in. Within a
regime all methods decode the same batches, interleaved batch by batch so the machine's
noise hits them alike. The script ends with the issue's two targets (cached greedy >= 5x
naive greedy, beam >= 0.5x cached greedy) against each regime, beside the ratios of
matrix-product FLOPs, which a purely compute-bound run would show.

Without --checkpoint the model is a randomly initialised small model
(configs/model/small.yaml) and the sources are encoded with a SentencePiece model trained
on data/sample. A random model almost never emits EOS, so it writes until the maximum
length, a * |x| + b with DecodeConfig's defaults (1.2, 10) for every method alike;
--fixed-len N makes every hypothesis exactly N tokens instead (min_len = max_len = N).

    python scripts/bench/bench_decode.py                                    # about 3 minutes
    python scripts/bench/bench_decode.py --sentences 200 --fixed-len 16 --naive-beam
    python scripts/bench/bench_decode.py --checkpoint runs/tatoeba_cpu/checkpoints/best
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from contextlib import nullcontext
from pathlib import Path

# isort: off
import transformer.commands  # noqa: F401  before torch: the OpenMP wait policy mt-translate runs under
# isort: on
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from transformer.checkpoint import load_model
from transformer.config import ModelConfig, load_preset, to_dataclass
from transformer.data.batching import length_batches, pad
from transformer.data.corpus import read_lines
from transformer.data.sentences import encode_sources
from transformer.data.tokenizer import train_tokenizer
from transformer.decoding.search import beam_search, greedy_search
from transformer.device import autocast, describe_cpu, keep_large_blocks_in_the_heap
from transformer.model.attention import set_attention_path
from transformer.model.transformer import build_model, count_parameters
from transformer.paths import project_path

ROOT = Path(__file__).resolve().parents[2]


def load_or_build(args):
    if args.checkpoint:
        return load_model(args.checkpoint)
    sample = ROOT / "data" / "sample"
    tokenizer = train_tokenizer(read_lines(sample / "train.it") + read_lines(sample / "train.en"),
                                vocab_size=500)
    # The small model keeps its 8k output vocabulary (its real cost); the 500-piece
    # sample vocabulary only encodes the sources.
    cfg = to_dataclass(ModelConfig, load_preset(ModelConfig, ROOT / "configs" / "model" / "small.yaml"))
    torch.manual_seed(0)
    return build_model(dataclasses.replace(cfg, dropout=0.0, attn_dropout=0.0)).eval(), tokenizer


class LastPosition(torch.nn.Module):
    """Output projection of the last position only, as naive decoders write it
    (`generator(out[:, -1])` in the Annotated Transformer): the naive baseline then
    does not pay for 8k-way projections of positions it has already decoded."""

    def __init__(self, proj: torch.nn.Module) -> None:
        super().__init__()
        self.proj = proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x[:, -1:])


def naive(model, run):
    """Run `run` with the model's decoder re-run over the whole prefix at every step."""
    def wrapped(src_ids):
        out_proj = model.out_proj
        model.out_proj = LastPosition(out_proj)
        try:
            return run(src_ids, use_cache=False)
        finally:
            model.out_proj = out_proj
    return wrapped


def methods(model, args) -> tuple[dict, int | None]:
    """name -> function(src_ids) returning n-best lists; and the fixed output length."""
    fixed = args.fixed_len or None
    length = (dict(max_len_a=0.0, max_len_b=fixed, min_len=fixed) if fixed
              else dict(max_len_a=1.2, max_len_b=10, min_len=1))

    def greedy(src_ids, use_cache=True):
        return [[h] for h in greedy_search(model, src_ids, use_cache=use_cache, **length)]

    def beam(src_ids, use_cache=True):
        return beam_search(model, src_ids, args.beam, use_cache=use_cache, **length)

    runs = {"greedy, naive": naive(model, greedy), "greedy, cached": greedy,
            f"beam {args.beam}, cached": beam}
    if args.naive_beam:
        runs[f"beam {args.beam}, naive"] = naive(model, beam)
    return runs, fixed


def time_runs(runs: dict, batches: list[torch.Tensor], naive_every: int) -> tuple[dict, dict]:
    """Seconds, sentences and output tokens per method: (all batches, naive's batches).

    Methods alternate batch by batch, so the machine's noise hits them alike. Naive
    methods run on every `naive_every`-th batch only (they are slow); what the cached
    methods did on those same batches is summed apart, for like-for-like ratios.
    """
    total = {name: dict(seconds=0.0, sentences=0, tokens=0) for name in runs}
    subset = {name: dict(seconds=0.0, sentences=0, tokens=0) for name in runs}
    for b, src_ids in enumerate(batches):
        for name, run in runs.items():
            if "naive" in name and b % naive_every:
                continue
            start = time.perf_counter()
            out = run(src_ids)
            seconds = time.perf_counter() - start
            for stats in [total] + ([subset] if b % naive_every == 0 else []):
                stats[name]["seconds"] += seconds
                stats[name]["sentences"] += len(out)
                stats[name]["tokens"] += sum(len(hyps[0].tokens) + 1 for hyps in out)  # + EOS
    return total, subset


def count_flops(runs: dict, batches: list[torch.Tensor], naive_every: int) -> dict:
    """Matrix-product FLOPs (mm, addmm, bmm, as torch's FlopCounterMode counts them) per
    sentence of each method, on the batches the naive methods are timed on.

    The arithmetic each method must do, whatever the machine: the ratio of two methods'
    FLOPs is the speed-up a purely compute-bound run would show.
    """
    flops = {}
    for name, run in runs.items():
        total, sentences = 0, 0
        for src_ids in batches[::naive_every]:
            with FlopCounterMode(display=False) as counter:
                sentences += len(run(src_ids))
            total += counter.get_total_flops()
        flops[name] = total / sentences
    return flops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="a checkpoint directory (default: random small model)")
    parser.add_argument("--source", default="../shared/data/tatoeba/dev.it",
                        help="sentences to translate (relative paths: from the project root)")
    parser.add_argument("--sentences", type=int, default=1000, help="how many of them")
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[2000],
                        help="source tokens per batch in the batched regime; several values "
                             "give one regime each (a sweep)")
    parser.add_argument("--single", type=int, default=200,
                        help="also decode this many of the sentences (evenly spaced, so every "
                             "length) one at a time, the interactive regime; 0 skips it")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--fixed-len", type=int, default=0,
                        help="exactly N output tokens per sentence (default: up to 1.2 |x| + 10)")
    parser.add_argument("--naive-every", type=int, default=4,
                        help="run the (slow) naive decoders on every N-th batch only")
    parser.add_argument("--naive-beam", action="store_true", help="also time naive beam search")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                        help="bf16: every method under bf16 autocast (AMX/AVX-512 CPUs)")
    parser.add_argument("--attention", default="explicit", choices=["explicit", "sdpa-math"],
                        help="sdpa-math: attention through SDPA's math kernel, as attention.py "
                             "did on CPU before (for comparison)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch.set_num_threads; 1 (default) gives steady figures on a "
                             "shared 2-core machine; 0 keeps torch's default")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    keep_large_blocks_in_the_heap()  # as mt-translate does on CPU (transformer/device.py)
    model, tokenizer = load_or_build(args)
    lines = read_lines(project_path(args.source))[: args.sentences]
    src = encode_sources(tokenizer, lines, model.cfg.max_positions)
    # Shortest first: the warm-up below then uses a short batch.
    regimes = {f"batches of <= {max_tokens} source tokens": (
        [pad([src[i] for i in b], tokenizer.pad_id)
         for b in reversed(length_batches([len(s) for s in src], max_tokens))],
        args.naive_every) for max_tokens in args.max_tokens}
    if args.single:
        step = max(1, len(src) // args.single)
        regimes["one sentence at a time"] = (
            [pad([src[i]], tokenizer.pad_id) for i in range(0, len(src), step)][: args.single], 1)
    runs, fixed = methods(model, args)
    if args.attention == "sdpa-math":
        set_attention_path(model, True)
    kernel = sdpa_kernel(SDPBackend.MATH) if args.attention == "sdpa-math" else nullcontext()
    results = {}
    with torch.inference_mode(), autocast(args.precision, torch.device("cpu")), kernel:
        batched, naive_every = next(iter(regimes.values()))
        for run in runs.values():  # warm-up
            run(batched[0][:4])
        for regime, (batches, every) in regimes.items():
            results[regime] = time_runs(runs, batches, every)
        flops = count_flops(runs, batched, naive_every)
    print(f"model: {'checkpoint ' + args.checkpoint if args.checkpoint else 'random small'} "
          f"({count_parameters(model) / 1e6:.1f}M parameters, vocab {model.cfg.vocab_size}); "
          f"{len(lines)} sentences of {args.source} (mean {sum(map(len, src)) / len(src):.1f} "
          f"source pieces); {torch.get_num_threads()} CPU threads, {args.precision}, "
          f"{args.attention} attention")
    print(f"CPU: {describe_cpu()}")
    print("output length: " + (
        f"fixed at {fixed} tokens + EOS for every method (min_len = max_len)" if fixed else
        "up to max_len = 1.2 |x| + 10 tokens for every method "
        + ("(a trained model stops at EOS)" if args.checkpoint else "(a random model runs to it)")))
    print("tokens/s: tokens of the returned (best) hypothesis + EOS, not of every beam")
    beam = f"beam {args.beam}"
    ratios = {}
    for regime, (total, subset) in results.items():
        batches, every = regimes[regime]
        print(f"\n## {regime} ({len(batches)} batches; naive methods on every {every}-th)")
        table, ratios[regime] = report(total, subset, beam)
        print(table)
    print("\nGFLOP per sentence (matrix products, FlopCounterMode): "
          + ", ".join(f"{name} {f / 1e9:.3f}" for name, f in flops.items()))
    print(verdict(ratios, flops, beam))


def report(total: dict, subset: dict, beam: str) -> tuple[str, dict]:
    """A markdown table of one regime, and its two ratios (cached/naive greedy, beam/greedy)."""
    def rate(stats: dict, name: str) -> float:
        return stats[name]["sentences"] / stats[name]["seconds"]

    rows = ["| method | sentences | tokens/sentence | seconds | sentences/s | tokens/s |",
            "|---|---:|---:|---:|---:|---:|"]
    for name, s in total.items():
        rows.append(f"| {name} | {s['sentences']} | {s['tokens'] / s['sentences']:.1f} | "
                    f"{s['seconds']:.1f} | {rate(total, name):.1f} | "
                    f"{s['tokens'] / s['seconds']:.0f} |")
    ratios = {"greedy cached / naive": rate(subset, "greedy, cached") / rate(subset, "greedy, naive"),
              f"{beam} / greedy cached": rate(total, f"{beam}, cached") / rate(total, "greedy, cached")}
    rows.append(f"On the {subset['greedy, naive']['sentences']} sentences naive greedy decoded: "
                f"cached greedy is {ratios['greedy cached / naive']:.2f}x as fast.")
    if f"{beam}, naive" in subset:
        rows.append(f"Cached {beam} is {rate(subset, f'{beam}, cached') / rate(subset, f'{beam}, naive'):.2f}x "
                    f"naive {beam} on those sentences.")
    rows.append(f"On all sentences: {beam} runs at {ratios[f'{beam} / greedy cached']:.2f}x the "
                "speed of cached greedy.")
    return "\n".join(rows), ratios


def verdict(ratios: dict, flops: dict, beam: str) -> str:
    """The issue's two targets against every regime, with the arithmetic's own ratios."""
    targets = {"greedy cached / naive": 5.0, f"{beam} / greedy cached": 0.5}
    arithmetic = {"greedy cached / naive": flops["greedy, naive"] / flops["greedy, cached"],
                  f"{beam} / greedy cached": flops["greedy, cached"] / flops[f"{beam}, cached"]}
    rows = ["\n## Targets (speed ratios; FLOPs column: the ratio a purely compute-bound run shows)",
            "| regime | " + " | ".join(f"{k} (>= {v:g})" for k, v in targets.items()) + " |",
            "|---|---:|---:|"]
    for regime, r in ratios.items():
        cells = [f"{r[k]:.2f}x {'met' if r[k] >= v else 'not met'}" for k, v in targets.items()]
        rows.append(f"| {regime} | " + " | ".join(cells) + " |")
    rows.append("| FLOPs | " + " | ".join(f"{arithmetic[k]:.2f}x" for k in targets) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
