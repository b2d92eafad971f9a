"""Training throughput: this trainer's step against a plain `torch.nn.Transformer` step.

Both models have the same size (configs/model/small.yaml by default), see the same
bucketed Tatoeba batches in the same order, and take a full step: forward, label-smoothed
loss, backward, gradient clipping, Adam. The two are timed in one process, alternating
rounds, so that the machine's noise hits both alike. Prints target tokens/s and the ratio,
in fp32 and bf16 autocast.

    python scripts/bench/bench_train.py                      # small model, fp32 and bf16
    python scripts/bench/bench_train.py --baseline sdpa-math --precisions bf16   # attention paths
    python scripts/bench/bench_train.py --model base --steps 10 --precisions bf16 --peak-tflops 989   # a GPU
    python scripts/bench/bench_train.py --data tatoeba europarl_tatoeba --set corpora.tatoeba=3 \
        --peak-tflops measure          # both data sets (the mix 3:1); utilisation of a measured matmul peak
    python scripts/bench/bench_train.py --precisions fp32 --compile false true   # torch.compile'd against eager

This trainer's step is the trainer's own update (`transformer.training.optimizer.Updater`:
clipping with `foreach`, the fused AdamW kernel skipping a non-finite update on the
device, nothing read back); batches are padded to `--pad-to-multiple` (default: 8 on a
GPU, 1 on a CPU, as training pads them). Eager bf16/fp16 reads the Linear weights'
low-precision copies, cast once a step (`LowPrecisionWeights`, as the trainer). With
`--compile true` this trainer's forward and loss are `torch.compile`d together, as the
trainer compiles them (`TrainForward`; the baseline stays eager), and the row reports how many
times it was compiled (`compiles`: once, the batch sizes dynamic from the start), its graph
breaks and the seconds of the first compile (`first_compile_s`: the first compiled call,
forward and backward); the warm-up round pays for compiling, the timed rounds do not. A
compile that fails gives a row with its error (`compile_error`) and no timing.

With a mix (`--data europarl_tatoeba`) the batches are drawn by the corpus weights, as in
training. `--peak-tflops measure` times a large matrix product in each precision on the
device (an attainable peak, not the data-sheet one) and prints model FLOPs utilisation.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import time
from pathlib import Path

# isort: off
import transformer.commands  # noqa: F401  before torch: the OpenMP wait policy mt-train runs under
# isort: on
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from transformer.config import DataConfig, ModelConfig, OptimConfig, load_preset, to_dataclass
from transformer.data.batching import Batch, TokenBatchSampler, collate, token_lengths
from transformer.data.pipeline import prepare_data
from transformer.device import (
    autocast,
    cpu_bf16_support,
    describe_cpu,
    keep_large_blocks_in_the_heap,
)
from transformer.model.attention import set_attention_path
from transformer.model.layers import sinusoid_table
from transformer.model.transformer import build_model, count_parameters
from transformer.training.forward import LowPrecisionWeights, TrainForward
from transformer.training.loss import batch_loss
from transformer.training.optimizer import Updater, build_optimizer

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CPU = torch.device("cpu")


class TorchTransformerMT(nn.Module):
    """What a `torch.nn.Transformer` user writes: embeddings, positions, nn.Transformer, output."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        self.register_buffer("sinusoids", sinusoid_table(cfg.max_positions, cfg.d_model))
        self.transformer = nn.Transformer(
            cfg.d_model, cfg.n_heads, cfg.n_encoder_layers, cfg.n_decoder_layers, cfg.d_ff,
            cfg.dropout, batch_first=True, norm_first=cfg.pre_norm)
        self.out = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.out.weight = self.embed.weight
        self.dropout = nn.Dropout(cfg.dropout)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.embed(ids) * self.cfg.d_model**0.5 + self.sinusoids[: ids.size(1)])

    def forward(self, src_ids: torch.Tensor, tgt_in_ids: torch.Tensor) -> torch.Tensor:
        src_pad, tgt_pad = src_ids == self.cfg.pad_id, tgt_in_ids == self.cfg.pad_id
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in_ids.size(1), device=src_ids.device)
        h = self.transformer(self._embed(src_ids), self._embed(tgt_in_ids), tgt_mask=causal,
                             src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad,
                             memory_key_padding_mask=src_pad, tgt_is_causal=True)
        return self.out(h)


def ours_loss(model, batch: Batch, eps: float, precision: str, device: torch.device) -> torch.Tensor:
    """The trainer's own loss: logits at the real target positions only, the fused loss."""
    return batch_loss(model, batch, eps, precision, device)[0]


def compiled_ours_loss(model, precision: str, device: torch.device):
    """`ours_loss` through the trainer's compiled forward (the forward and the loss compiled
    together, each batch's sizes dynamic from the first compile, as `Trainer` compiles
    them), and that `TrainForward`, which holds the first compile's seconds."""
    forward = TrainForward(model, model, precision, device, compile=True)
    return (lambda model, batch, eps, precision, device: forward(batch, eps, first=True)[0]), forward


def torch_loss(model, batch: Batch, eps: float, precision: str, device: torch.device) -> torch.Tensor:
    with autocast(precision, device):
        logits = model(batch.src_ids, batch.tgt_in_ids)
    return F.cross_entropy(logits.flatten(0, 1).float(), batch.tgt_out_ids.flatten(),
                           ignore_index=batch.pad_id, label_smoothing=eps, reduction="sum")


def sdpa_math_loss(model, batch: Batch, eps: float, precision: str, device: torch.device) -> torch.Tensor:
    """This trainer's loss with every attention through SDPA's math kernel (--baseline sdpa-math)."""
    with sdpa_kernel(SDPBackend.MATH):
        return batch_loss(model, batch, eps, precision, device)[0]


def build_baseline(name: str, cfg: ModelConfig, device: torch.device):
    """(model, loss function) of the baseline: nn.Transformer, or this trainer's model whose
    attention runs through SDPA's math kernel instead of the explicit CPU product."""
    if name == "torch":
        return TorchTransformerMT(cfg).to(device), torch_loss
    torch.manual_seed(0)
    model = build_model(cfg).to(device)
    set_attention_path(model, True)
    return model, sdpa_math_loss


def run_steps(model, loss_fn, opt, batches: list[Batch], precision: str,
              device: torch.device = CPU, low: LowPrecisionWeights | None = None) -> tuple[float, int]:
    """Full training steps over `batches` (already on `device`); returns (seconds, target
    tokens). `opt` is an optimizer (a plain step: clip, `opt.step()`) or the trainer's
    `Updater` (which clips and steps). `low`: the forward reads the Linear weights' copies
    in autocast's dtype, refreshed once a step, as the trainer's eager mixed precision."""
    model.train()
    tokens, t0 = 0, time.perf_counter()
    for batch in batches:
        n = batch.n_tgt_tokens
        if low is not None:
            low.refresh()
        with low.swapped() if low is not None else contextlib.nullcontext():
            loss = loss_fn(model, batch, 0.1, precision, device)
        (loss / n).backward()
        if low is not None:
            low.collect(first=True)
        if isinstance(opt, Updater):
            opt()
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        tokens += n
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0, tokens


def step_flops(model, batches: list[Batch]) -> float:
    """Model FLOPs of forward + backward (6 per parameter and token, the usual estimate):
    encoder weights see the padded source tokens, decoder and output weights the padded
    target tokens; attention scores are left out (small for sentences)."""
    enc = sum(p.numel() for n, p in model.named_parameters() if n.startswith("encoder"))
    dec = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("encoder"))
    return sum(6 * (enc * b.src_ids.numel() + dec * b.tgt_in_ids.numel()) for b in batches)


# Where a step's time goes: each profiled op's own time by kind. Ops on a (tokens x
# vocabulary) tensor are the loss's (the output matmul stays a matmul).
MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}
KINDS = [("casts and copies", {"aten::copy_", "aten::_to_copy", "aten::clone"}),
         ("attention softmax and masks", {"aten::_softmax", "aten::_softmax_backward_data",
                                          "aten::masked_fill", "aten::masked_fill_", "aten::div"}),
         ("LayerNorm", {"aten::native_layer_norm", "aten::native_layer_norm_backward"}),
         ("optimizer", {"aten::_fused_adamw_", "aten::_fused_adam_", "aten::lerp_", "aten::addcdiv_",
                        "aten::addcmul_", "aten::sqrt", "aten::linalg_vector_norm", "aten::_foreach_norm"})]


def profile_step(model, loss_fn, opt, batches: list[Batch], precision: str, device: torch.device,
                 vocab: int, flops: float, peak: float | None) -> None:
    """One profiled round of this trainer's steps: milliseconds per step by kind of op, and
    the utilisation if everything but the matrix products took no time (the floor)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        secs, _ = run_steps(model, loss_fn, opt, batches, precision, device)
    per_kind: dict[str, float] = {}
    for e in prof.events():
        if e.device_type.name != "CPU" or not e.name.startswith("aten::"):
            continue
        kind = "matrix products" if e.name in MATMUL_OPS else None
        if kind is None and any(s and s[-1] == vocab for s in e.input_shapes if isinstance(s, list)):
            kind = "loss (tokens x vocabulary)"
        kind = kind or next((k for k, names in KINDS if e.name in names), "other element-wise")
        per_kind[kind] = per_kind.get(kind, 0.0) + e.self_cpu_time_total / 1e3
    n = len(batches)
    total = sum(per_kind.values())
    print(f"{'':<10}profile of one round ({secs / n * 1e3:.0f} ms a step under the profiler), ms a step:")
    for kind, ms in sorted(per_kind.items(), key=lambda kv: -kv[1]):
        print(f"{'':<12}{kind:<30}{ms / n:8.1f}  {ms / total:6.1%}")
    if peak:
        mm = per_kind.get("matrix products", 0.0) / 1e3
        print(f"{'':<12}floor: the matrix products alone would run at "
              f"{flops / mm / 1e12:.3f} TFLOP/s, MFU {flops / mm / 1e12 / peak:.1%}")


def matmul_tflops(precision: str, device: torch.device, n: int = 4096, reps: int = 10) -> float:
    """Attainable dense TFLOP/s: the fastest of `reps` n x n matrix products in `precision`
    (the fastest, not the median: on a shared machine a median counts other processes' time,
    which put the same CPU's bf16 peak anywhere from 0.62 to 0.92 TFLOP/s)."""
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    secs = []
    for _ in range(reps + 1):  # the first is a warm-up
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        secs.append(time.perf_counter() - t0)
    return 2 * n**3 / min(secs[1:]) / 1e12


def load_batches(name: str, overrides: list[str], max_tokens: int, steps: int, device: torch.device,
                 pad_to_multiple: int = 1):
    """(data, the first `steps` batches of epoch 0 on `device`) of configs/data/<name>.yaml;
    `overrides` (KEY=VALUE) apply where the data config has the key (corpora.* to a mix)."""
    data_yaml = load_preset(DataConfig, CONFIGS / "data" / f"{name}.yaml")
    mine = [o for o in overrides if OmegaConf.select(data_yaml, o.split("=", 1)[0]) is not None]
    data = prepare_data(to_dataclass(DataConfig, OmegaConf.merge(data_yaml, OmegaConf.from_dotlist(mine))))
    tok = data.tokenizer
    train = data.train.select_columns(["src_ids", "tgt_ids"])
    sampler = TokenBatchSampler(*token_lengths(train), max_tokens=max_tokens, seed=1,
                                mixture=data.mixture(seed=1), pad_to_multiple=pad_to_multiple)
    return data, [collate(train[idx], tok.pad_id, tok.bos_id, tok.eos_id, pad_to_multiple).to(device)
                  for idx in sampler.batches(0)[:steps]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small", help="a configs/model/*.yaml name")
    ap.add_argument("--data", nargs="+", default=["tatoeba"], help="configs/data/*.yaml names, one table each")
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=20, help="steps per timed round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--baseline", default="torch", choices=["torch", "sdpa-math"],
                    help="torch: a plain nn.Transformer; sdpa-math: this trainer with attention "
                         "through SDPA's math kernel (what attention.py did on CPU before)")
    ap.add_argument("--peak-tflops", default=None,
                    help="the device's dense peak at this precision, to print model FLOPs utilisation "
                         "(H100 SXM bf16: 989; H200: 989), or 'measure' to time a large matmul")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="overrides of the data config where it has the key, e.g. corpora.tatoeba=3")
    ap.add_argument("--profile", action="store_true",
                    help="after timing, profile one round of this trainer's steps: time by kind of op")
    ap.add_argument("--model-set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="overrides of the model config, e.g. pre_norm=true attn_dropout=0 (the prose recipe)")
    ap.add_argument("--matmul-n", type=int, default=None,
                    help="size of the matrix product --peak-tflops measure times (default 8192 on CUDA, 4096 on a CPU)")
    ap.add_argument("--compile", nargs="+", default=["false"], choices=["false", "true"],
                    help="torch.compile this trainer's model: a row for each (the baseline stays eager)")
    ap.add_argument("--pad-to-multiple", type=int, default=None,
                    help="pad batch lengths to a multiple of this (default: 8 on a GPU, 1 on a CPU, as training)")
    ap.add_argument("--json", default=None, metavar="PATH",
                    help="also write every result line as a JSON list to PATH (scripts/gpu/gpu_check.py)")
    args = ap.parse_args()
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    else:  # what mt-train does on CPU; a process-wide setting, so both models run with it
        keep_large_blocks_in_the_heap()
    print(f"device: {torch.cuda.get_device_name(device) if device.type == 'cuda' else describe_cpu()}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}")
    if device.type == "cpu" and "bf16" in args.precisions and not cpu_bf16_support()[0]:
        print("note: this CPU has no native bf16: bf16 autocast is emulated, ~30x slower than fp32")
    peaks: dict[str, float] = {}
    results: list[dict] = []
    pad_to = args.pad_to_multiple or (8 if device.type == "cuda" else 1)
    for name in args.data:
        data, batches = load_batches(name, args.set, args.max_tokens, args.steps, device, pad_to)
        tok = data.tokenizer
        model_yaml = OmegaConf.merge(load_preset(ModelConfig, CONFIGS / "model" / f"{args.model}.yaml"),
                                     OmegaConf.from_dotlist(args.model_set))
        model_cfg = dataclasses.replace(to_dataclass(ModelConfig, model_yaml),
                                        vocab_size=tok.vocab_size, pad_id=tok.pad_id)
        print(f"\ndata={name} model={args.model} {' '.join(args.model_set)} vocab={tok.vocab_size} "
              f"threads={torch.get_num_threads()} batches={len(batches)} x "
              f"~{statistics.mean(b.n_tgt_tokens for b in batches):.0f} target tokens"
              + (f", corpus weights {data.weights}" if data.weights else ""))
        print(f"parameters: this trainer {count_parameters(build_model(model_cfg)):,}, "
              f"nn.Transformer {count_parameters(TorchTransformerMT(model_cfg)):,} (its final LayerNorms)")
        base_name = "nn.Transformer" if args.baseline == "torch" else "SDPA math"
        print(f"{'precision':<10}{'compile':<9}{'this trainer tok/s':>20}{base_name + ' tok/s':>22}{'ratio':>8}")
        for precision in args.precisions:
            if args.peak_tflops == "measure" and precision not in peaks:
                peaks[precision] = matmul_tflops(
                    precision, device, n=args.matmul_n or (8192 if device.type == "cuda" else 4096))
            peak = peaks.get(precision) or (float(args.peak_tflops) if args.peak_tflops else None)
            for compiled in args.compile:
                result = bench_precision(args, model_cfg, batches, precision, device, base_name, peak,
                                         compiled == "true")
                results.append({"data": name, "model": args.model, "max_tokens": args.max_tokens,
                                "pad_to_multiple": pad_to,
                                "parameters": count_parameters(build_model(model_cfg)), **result})
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def bench_precision(args, model_cfg: ModelConfig, batches: list[Batch], precision: str,
                    device: torch.device, base_name: str, peak: float | None, compiled: bool = False) -> dict:
    """Alternating timed rounds of this trainer and the baseline; one line of results,
    also returned as a dict (target tokens/s of each, ratio, MFU, peak memory, and with
    `compiled` the compiles and graph breaks of this trainer's torch.compile'd model)."""
    from torch._dynamo.utils import counters

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    torch.manual_seed(0)
    ours = build_model(model_cfg).to(device)
    counters.clear()
    ours_fn, forward = compiled_ours_loss(ours, precision, device) if compiled else (ours_loss, None)
    runs = {"ours": (ours, ours_fn), "torch": build_baseline(args.baseline, model_cfg, device)}
    low_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)  # as `Trainer` decides
    lows = {"ours": LowPrecisionWeights(ours, low_dtype) if low_dtype and not compiled else None, "torch": None}
    # ours: the trainer's own update (fused AdamW, the skip of a non-finite update on the
    # device); the baseline: what an nn.Transformer user writes (torch.optim.Adam, PyTorch's
    # default implementation)
    optim_cfg = OptimConfig(lr=1e-4, warmup_steps=1)
    ours_opt = build_optimizer(ours, optim_cfg, device)
    scaler = torch.amp.GradScaler(device.type, enabled=False)
    opts = {"ours": Updater(ours, ours_opt, scaler, optim_cfg, device),
            "torch": torch.optim.Adam(runs["torch"][0].parameters(), lr=1e-4,
                                      betas=(0.9, 0.98), eps=1e-9)}
    for k, (m, fn) in runs.items():  # warm-up: allocator, kernels, optimizer state; compiling
        run_steps(m, fn, opts[k], batches[:3], precision, device, lows[k])
    if forward is not None and forward.compile_error:  # it fell back to eager: nothing compiled to time
        print(f"{precision:<10}{'true':<9}compiling failed: {forward.compile_error}", flush=True)
        return {"precision": precision, "compile": True, "compile_error": forward.compile_error}
    rates: dict[str, list[float]] = {"ours": [], "torch": []}
    secs_ours: list[float] = []
    for _ in range(args.rounds):
        for k, (m, fn) in runs.items():
            secs, toks = run_steps(m, fn, opts[k], batches, precision, device, lows[k])
            rates[k].append(toks / secs)
            if k == "ours":
                secs_ours.append(secs)
    o, t = statistics.median(rates["ours"]), statistics.median(rates["torch"])
    result = {"precision": precision, "compile": compiled, "tokens_per_s": o, "baseline": base_name,
              "baseline_tokens_per_s": t, "ratio": o / t}
    extra = ""
    if compiled:
        result["compiles"] = counters["frames"]["total"]
        result["graph_breaks"] = sum(counters["graph_break"].values())
        result["first_compile_s"] = round(forward.compile_seconds, 1)
        extra += (f"  compiles {result['compiles']}, graph breaks {result['graph_breaks']}, "
                  f"first compile {result['first_compile_s']} s")
    if peak:
        achieved = step_flops(ours, batches) / statistics.median(secs_ours) / 1e12
        extra += f"  model TFLOP/s {achieved:.3f}, peak {peak:.3f}, MFU {achieved / peak:.1%}"
        result |= {"model_tflops": achieved, "peak_tflops": peak, "mfu": achieved / peak}
    if device.type == "cuda":
        memory = torch.cuda.max_memory_allocated(device) / 2**30
        extra += f"  peak memory {memory:.1f} GiB"
        result["peak_memory_gib"] = memory
    print(f"{precision:<10}{str(compiled).lower():<9}{o:>20,.0f}{t:>22,.0f}{o / t:>8.2f}{extra}")
    rounds = ", ".join(f"{a:,.0f}/{b:,.0f}" for a, b in zip(rates["ours"], rates["torch"]))
    print(f"{'':<10}rounds (this trainer/{base_name}): {rounds}", flush=True)
    if args.profile:
        profile_step(ours, runs["ours"][1], opts["ours"], batches, precision, device,
                     model_cfg.vocab_size, step_flops(ours, batches), peak)
    return result


if __name__ == "__main__":
    main()
