"""What a decoder step costs, per decoding batch: steps, milliseconds a step, host ops a
step, and on CUDA the caching allocator's allocations and cudaMalloc retries.

    python scripts/profile_decode.py CK ../shared/data/eval/tatoeba-test.it --lines 2000
    python scripts/profile_decode.py CK IN.it --device cuda --expandable --json out.json

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


def _run(model, tokenizer, device, lines, cfg, batches: list[dict], counting: bool, save) -> None:
    """One pass; appends (timed) or fills in (counting) the per-batch figures."""
    steps: list[int] = []
    decode = model.decode
    model.decode = lambda *a, **kw: steps.append(1) or decode(*a, **kw)
    state = {"start": time.perf_counter(), "before": _allocator(device), "batch": 0, "ops": Ops()}

    def after_batch() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if counting:
            batches[state["batch"]]["ops_per_step"] = round(state["ops"].count / max(len(steps), 1), 1)
            state["ops"].count = 0
        else:
            ms = (time.perf_counter() - state["start"]) * 1000
            after = _allocator(device)
            batches.append({"decoder_steps": len(steps), "ms_per_step": round(ms / max(len(steps), 1), 3),
                            **{f"{k}_before": v for k, v in state["before"].items()},
                            **{f"{k}_after": v for k, v in after.items()}})
            state["before"] = after
        steps.clear()
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
        del model.decode  # the class's method again


def profile(checkpoint: str, lines: list[str], device: str = "auto", methods=("beam", "greedy"),
            beam_size: int = 5, batch_tokens: int | None = None, dtype: str | None = "auto",
            json_path: Path | None = None, expandable: bool = False) -> dict:
    """The per-batch report for each method: {method: {"batches": [...], "sent_per_s": x},
    "expandable_segments": {...} (a child's report, with `expandable`)}."""
    model, tokenizer, torch_device = load_for_inference(checkpoint, device, dtype=dtype)
    report: dict = {"device": str(torch_device), "lines": len(lines)}

    def save() -> None:
        if json_path is not None:
            Path(json_path).write_text(json.dumps(report, indent=1))

    for method in methods:
        cfg = DecodeConfig(method=method, beam_size=beam_size, batch_tokens=batch_tokens)
        batches: list[dict] = []
        report[method] = {"batches": batches}
        start = time.perf_counter()
        _run(model, tokenizer, torch_device, lines, cfg, batches, counting=False, save=save)
        report[method]["sent_per_s"] = round(len(lines) / (time.perf_counter() - start), 1)
        save()
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
    args = parser.parse_args()
    lines = sys.stdin.read().splitlines() if args.input == "-" else read_lines(args.input)
    lines = lines[:args.lines] if args.lines else lines
    report = profile(args.checkpoint, lines, args.device, tuple(args.methods.split(",")),
                     args.beam_size, args.batch_tokens, None if args.dtype == "None" else args.dtype,
                     args.json, args.expandable)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
