"""Our model against its CTranslate2 exports (fp32, int8): sentences/s and BLEU, one process.

    python scripts/bench/bench_ct2.py --checkpoint runs/tatoeba_cpu/checkpoints/best
    python scripts/bench/bench_ct2.py --checkpoint CKPT --max-sentences 500 --threads 2

Exports the checkpoint twice into a temporary directory (mt-export quantization=none and
int8), then translates tatoeba-test (`../shared/data/eval/tatoeba-test.{it,en}`, 8,616
sentences) with beam 5 and with greedy search, each three ways: our PyTorch search in
fp32, CTranslate2 fp32, CTranslate2 int8. Everything else is DecodeConfig's defaults (GNMT
lenpen 0.6, maximum length 1.2 |x| + 10, batches of 2,000 source tokens) and --threads CPU
threads for both engines (torch.set_num_threads, CTranslate2's intra_threads). Each
timed run is the whole test set through `decoding.text.translate_lines` (normalising,
encoding, batching, searching, decoding), after a warm-up on its first 50 sentences.

Prints the CPU, each model directory's size, then per run sentences/s, sacrebleu's
default BLEU and the share of lines identical to our model's, and last the issue's
target: CTranslate2 int8 beam 5 at least 2x our beam 5 in sentences/s, BLEU within 0.5.
On a shared machine set OMP_WAIT_POLICY=PASSIVE (docs/performance.md, "OMP_WAIT_POLICY").
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

# isort: off
import transformer.commands  # noqa: F401  before torch: the OpenMP wait policy mt-translate runs under
# isort: on
import torch
from sacrebleu.metrics import BLEU

from transformer.commands.export import export
from transformer.config import DataConfig, DecodeConfig
from transformer.data.pipeline import load_test_set
from transformer.decoding.ct2_model import CT2Model
from transformer.decoding.loading import load_for_inference
from transformer.decoding.text import translate_lines
from transformer.deploy.ct2_export import ExportConfig
from transformer.device import describe_cpu

WARMUP = 50


def directory_size(path: str | Path) -> int:
    return sum(f.stat().st_size for f in Path(path).iterdir() if f.is_file())


def timed(model, tokenizer, src: list[str], cfg: DecodeConfig) -> tuple[list[str], float]:
    """Translations of src and sentences/s, after a warm-up."""
    translate_lines(model, tokenizer, src[:WARMUP], cfg, "cpu")
    start = time.perf_counter()
    hyps = translate_lines(model, tokenizer, src, cfg, "cpu")
    return hyps, len(src) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True, help="a trained checkpoint directory")
    parser.add_argument("--max-sentences", type=int, default=None, help="the first N test sentences")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of both engines")
    args = parser.parse_args()

    src, refs = load_test_set("tatoeba-test", DataConfig())
    src, refs = src[: args.max_sentences], refs[: args.max_sentences]
    model, tokenizer, _ = load_for_inference(args.checkpoint, "cpu", args.threads)
    print(f"CPU: {describe_cpu()}; {args.threads} threads; torch {torch.__version__}")
    print(f"tatoeba-test: {len(src)} sentences; checkpoint {args.checkpoint}")
    with tempfile.TemporaryDirectory() as tmp:
        engines = {"ours fp32": model}
        sizes = {"ours fp32": directory_size(args.checkpoint)}
        for name, quantization in (("ctranslate2 fp32", "none"), ("ctranslate2 int8", "int8")):
            path = export(ExportConfig(checkpoint=args.checkpoint, output=f"{tmp}/{quantization}",
                                       quantization=quantization))
            engines[name] = CT2Model(path, "cpu", args.threads)
            sizes[name] = directory_size(path)
        for name, size in sizes.items():
            engine = getattr(engines[name], "engine", "")
            print(f"  {name:17s} model directory {size / 1e6:6.1f} MB  {engine}")

        results: dict[tuple[str, str], tuple[float, float]] = {}
        print("\n| search | engine | sentences/s | BLEU | same output as ours |")
        print("|---|---|---:|---:|---:|")
        for method in ("beam", "greedy"):
            ours_hyps: list[str] = []
            for name, engine in engines.items():
                precision = "fp32" if name.startswith("ours") else "auto"  # an export: its own
                cfg = DecodeConfig(method=method, precision=precision)
                hyps, speed = timed(engine, tokenizer, src, cfg)
                ours_hyps = ours_hyps or hyps
                bleu = BLEU().corpus_score(hyps, [refs]).score
                same = sum(h == o for h, o in zip(hyps, ours_hyps, strict=True)) / len(hyps)
                results[method, name] = speed, bleu
                label = "beam 5" if method == "beam" else "greedy"
                print(f"| {label} | {name} | {speed:.1f} | {bleu:.2f} | {100 * same:.1f}% |",
                      flush=True)

    ours, int8 = results["beam", "ours fp32"], results["beam", "ctranslate2 int8"]
    ratio, delta = int8[0] / ours[0], int8[1] - ours[1]
    met = ratio >= 2.0 and abs(delta) <= 0.5
    print(f"\ntarget: CTranslate2 int8 beam 5 >= 2x our beam 5 sentences/s with BLEU within 0.5: "
          f"{ratio:.2f}x, BLEU {delta:+.2f} -> {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
