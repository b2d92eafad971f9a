"""What a decoder step costs, per decoding batch: steps, milliseconds a step, host ops a
step, and on CUDA the caching allocator's allocations and cudaMalloc retries; with the step
compiled (`--compile`, `decode.compile`'s modes), the graphs dynamo traced, the CUDA graphs
inductor recorded, and the seconds the first compiled step took (its compile).

    python scripts/profile_decode.py CK ../shared/data/eval/tatoeba-test.it --lines 2000
    python scripts/profile_decode.py CK IN.it --device cuda --expandable --json out.json
    python scripts/profile_decode.py CK IN.it --device cuda --compile none,reduce-overhead

Two passes over the same batches (`text.translate_nbest`, so what mt-translate runs): a
timed one (the device synchronised at each batch's end; on CUDA `torch.cuda.memory_stats()`
read before and after each batch: `allocation.all.allocated`, the allocations, and
`num_alloc_retries`, the cudaMalloc calls retried after freeing the cache), then one
counting the non-view ops each batch dispatches from the host (a TorchDispatchMode, as
/work/shared/tools/decode_cost.py counts them). `--expandable` repeats the timed pass in a
child process under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the allocator is
configured when CUDA starts, so not in this process). With --json the report is written
after every batch, so a run cut off keeps what it measured.

`profile(...)` is the function a caller (scripts/gpu/gpu_check.py's decode step) runs.
Each method runs once per compile mode (`none` first: the eager baseline); a compiled
mode's first batch pays for its compile, so its `sent_per_s` counts every batch and
`warm_sent_per_s` the batches after the first.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from transformer.config import DecodeConfig
from transformer.data.corpus import read_lines
from transformer.decoding import text as text_module
from transformer.decoding.decoder_state import DecoderState
from transformer.decoding.loading import load_for_inference
from transformer.decoding.text import translate_nbest

VIEWS = frozenset({"view", "transpose", "unsqueeze", "slice", "expand", "t", "_unsafe_view",
                   "flatten", "select", "detach", "alias", "reshape", "squeeze", "as_strided",
                   "permute", "_reshape_alias", "lift_fresh", "split", "unbind",
                   "split_with_sizes", "narrow", "unflatten", "view_as", "expand_as", "diagonal"})


class Ops(TorchDispatchMode):
    """Non-view ops dispatched from the host."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ not in VIEWS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _allocator(device: torch.device) -> dict[str, int]:
    if device.type != "cuda":
        return {}
    stats = torch.cuda.memory_stats(device)
    return {"allocations": stats.get("allocation.all.allocated", 0),
            "alloc_retries": stats.get("num_alloc_retries", 0)}


class Compiled:
    """Counts, while it is entered, what compiling the decoder step does: the graphs dynamo
    traces (its counters), the CUDA graphs inductor records (cudagraph trees' recordings),
    and the seconds of the first compiled step, its compile included (device synchronised)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.first_step_s, self.recorded = device, None, 0

    def __enter__(self):
        from torch._dynamo.utils import counters

        self.counters = counters
        self.graphs0 = counters["stats"]["unique_graphs"]
        self.skips0 = counters["inductor"]["cudagraph_skips"]
        self.step = DecoderState._static_log_probs
        compiled = self

        def timed(state):
            if compiled.first_step_s is not None:
                return compiled.step(state)
            start = time.perf_counter()
            out = compiled.step(state)
            if compiled.device.type == "cuda":
                torch.cuda.synchronize(compiled.device)
            compiled.first_step_s = round(time.perf_counter() - start, 2)
            return out

        DecoderState._static_log_probs = timed
        self.manager = None
        if self.device.type == "cuda":
            from torch._inductor import cudagraph_trees

            self.manager = cudagraph_trees.CUDAGraphTreeManager
            self.record = self.manager.record_function

            def counted(manager, *a, **kw):
                compiled.recorded += 1
                return compiled.record(manager, *a, **kw)

            self.manager.record_function = counted
        return self

    def figures(self) -> dict:
        return {"graphs": self.counters["stats"]["unique_graphs"] - self.graphs0,
                "cuda_graphs_recorded": self.recorded,
                "cudagraph_skips": self.counters["inductor"]["cudagraph_skips"] - self.skips0,
                "first_compiled_step_s": self.first_step_s}

    def __exit__(self, *exc) -> None:
        DecoderState._static_log_probs = self.step
        if self.manager is not None:
            self.manager.record_function = self.record


def _run(model, tokenizer, device, lines, cfg, batches: list[dict], counting: bool, save,
         compiled: Compiled | None = None) -> None:
    """One pass; appends (timed) or fills in (counting) the per-batch figures."""
    steps: list[int] = []
    sentences: list[int] = []
    log_probs, search = DecoderState.log_probs, text_module.search
    DecoderState.log_probs = lambda state: steps.append(1) or log_probs(state)
    text_module.search = lambda model, src_ids, *a, **kw: sentences.append(src_ids.size(0)) or \
        search(model, src_ids, *a, **kw)
    state = {"start": time.perf_counter(), "before": _allocator(device), "batch": 0, "ops": Ops(),
             "graphs": 0, "recorded": 0}

    def after_batch() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if counting:
            batches[state["batch"]]["ops_per_step"] = round(state["ops"].count / max(len(steps), 1), 1)
            state["ops"].count = 0
        else:
            ms = (time.perf_counter() - state["start"]) * 1000
            after = _allocator(device)
            batches.append({"sentences": sum(sentences), "decoder_steps": len(steps),
                            "ms_per_step": round(ms / max(len(steps), 1), 3), "ms": round(ms, 1),
                            **{f"{k}_before": v for k, v in state["before"].items()},
                            **{f"{k}_after": v for k, v in after.items()}})
            if compiled is not None:  # what this batch compiled and recorded
                now = compiled.figures()
                batches[-1]["graphs"] = now["graphs"] - state["graphs"]
                batches[-1]["cuda_graphs_recorded"] = now["cuda_graphs_recorded"] - state["recorded"]
                state["graphs"], state["recorded"] = now["graphs"], now["cuda_graphs_recorded"]
            state["before"] = after
        steps.clear()
        sentences.clear()
        state["batch"] += 1
        save()
        state["start"] = time.perf_counter()

    try:
        if counting:
            with state["ops"]:
                translate_nbest(model, tokenizer, lines, cfg, device, after_batch=after_batch)
        else:
            translate_nbest(model, tokenizer, lines, cfg, device, after_batch=after_batch)
    finally:
        DecoderState.log_probs, text_module.search = log_probs, search


def profile(checkpoint: str, lines: list[str], device: str = "auto", methods=("beam", "greedy"),
            beam_size: int = 5, batch_tokens: int | None = None, dtype: str | None = "auto",
            json_path: Path | None = None, expandable: bool = False,
            compile_modes: tuple[str, ...] = ("none",), count_ops: bool = True) -> dict:
    """The per-batch report for each method and compile mode: {method: {"batches": [...],
    "sent_per_s": x, ...}} for mode none, {f"{method}/{mode}": ...} for another mode, and
    "expandable_segments": {...} (a child's report, with `expandable`)."""
    model, tokenizer, torch_device = load_for_inference(checkpoint, device, dtype=dtype)
    report: dict = {"device": str(torch_device), "lines": len(lines)}

    def save() -> None:
        if json_path is not None:
            Path(json_path).write_text(json.dumps(report, indent=1))

    for method in methods:
        for mode in compile_modes:
            cfg = DecodeConfig(method=method, beam_size=beam_size, batch_tokens=batch_tokens, compile=mode)
            batches: list[dict] = []
            entry = report[method if mode == "none" else f"{method}/{mode}"] = {"batches": batches}
            start = time.perf_counter()
            if mode == "none":
                _run(model, tokenizer, torch_device, lines, cfg, batches, counting=False, save=save)
            else:
                with Compiled(torch_device) as compiled:
                    _run(model, tokenizer, torch_device, lines, cfg, batches, False, save, compiled)
                entry.update(compiled.figures())
            seconds = time.perf_counter() - start
            entry["sent_per_s"] = round(len(lines) / seconds, 1)
            if len(batches) > 1:  # the batches after the first (which pays for a compile)
                rest = batches[1:]
                entry["warm_sent_per_s"] = round(sum(b["sentences"] for b in rest)
                                                 / (sum(b["ms"] for b in rest) / 1000), 1)
            save()
            if mode == "none" and count_ops:  # host ops: the eager step's (a dispatch mode runs compiled code eagerly)
                _run(model, tokenizer, torch_device, lines, cfg, batches, counting=True, save=save)
    if expandable and torch_device.type == "cuda":
        report["expandable_segments"] = _child(checkpoint, lines, device, methods, beam_size,
                                               batch_tokens, dtype)
        save()
    return report


def _child(checkpoint, lines, device, methods, beam_size, batch_tokens, dtype) -> dict:
    """The same profile in a child process under expandable_segments:True."""
    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    args = [sys.executable, __file__, checkpoint, "-", "--device", device, "--methods",
            ",".join(methods), "--beam-size", str(beam_size), "--dtype", str(dtype)]
    if batch_tokens:
        args += ["--batch-tokens", str(batch_tokens)]
    done = subprocess.run(args, input="\n".join(lines), capture_output=True, text=True, env=env)
    if done.returncode:
        return {"status": "failed", "error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("input", help="source lines, one a line; - for stdin")
    parser.add_argument("--lines", type=int, default=None, help="the first N lines only")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--methods", default="beam,greedy")
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--batch-tokens", type=int, default=None)
    parser.add_argument("--dtype", default="auto", help="the weights' dtype (load_for_inference)")
    parser.add_argument("--expandable", action="store_true",
                        help="also the timed pass under expandable_segments:True (CUDA)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--no-ops", action="store_true", help="skip the pass counting host ops")
    parser.add_argument("--compile", default="none",
                        help="decode.compile modes, each a run: none,reduce-overhead,...")
    args = parser.parse_args()
    lines = sys.stdin.read().splitlines() if args.input == "-" else read_lines(args.input)
    lines = lines[:args.lines] if args.lines else lines
    report = profile(args.checkpoint, lines, args.device, tuple(args.methods.split(",")),
                     args.beam_size, args.batch_tokens, None if args.dtype == "None" else args.dtype,
                     args.json, args.expandable, tuple(args.compile.split(",")), not args.no_ops)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
