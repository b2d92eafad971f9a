"""What one training update costs the host: reads of device values, aten ops, kernel
launches, and the device's busy fraction, over a few updates of a real trainer.

    python scripts/profile_update.py debug=default data=sample                  # a CPU, the debug model
    python scripts/profile_update.py model=base data=tatoeba trainer.device=cuda --json out.json

The trainer is built by `mt-train`'s own `train` (a two-update run into a fresh
`trainer.run_dir`), then driven as `fit` drives it: an update, and a read of its metrics
when the loop is due one (`trainer.log_every`, 10 here). Counted over `--updates` updates
after a warm-up: the host's reads (`transformer.device.HostReads`; a GPU waits at each),
then under `torch.profiler`: aten ops, CUDA kernel launches and synchronisations, and the
fraction of the wall time the GPU ran kernels (null on a CPU). Works with the code before
#49 too (its update reads inside `train_step`; run it with that checkout's PYTHONPATH).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

# isort: off
import transformer.commands  # noqa: F401  before torch: the OpenMP wait policy mt-train runs under
# isort: on
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from transformer.commands import cli
from transformer.commands.train import train
from transformer.config import TrainConfig, to_dataclass
from transformer.paths import PROJECT_ROOT

try:
    from transformer.device import HostReads
except ImportError:  # a checkout from before the counter (#49's baseline): this script's own copy
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "device_with_hostreads", Path(__file__).resolve().parent.parent / "transformer" / "device.py")
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
    HostReads = _module.HostReads

LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def build_trainer(overrides: list[str], run_dir: Path):
    cli.register_configs()
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, "trainer.max_steps=2", "trainer.val_every=1000000",
                                          "trainer.log_every=10", "trainer.progress=false",
                                          "trainer.val_bleu_sentences=1", f"trainer.run_dir={run_dir}",
                                          "trainer.resume=never"])
    trainer = train(to_dataclass(TrainConfig, cfg), OmegaConf.to_yaml(cfg))
    trainer.tc.max_steps = 10**9  # the measured updates are mid-run
    return trainer


def drive(trainer, batches: list[list]) -> None:
    """Updates as `fit` makes them: each, then a read of the meter when due (this code)."""
    for micro in batches:
        trainer.train_step(micro)
        if hasattr(trainer, "read_and_recount") and trainer._due():
            trainer.read_and_recount()


def busy_fraction(events, wall_us: float) -> float:
    """The union of the GPU kernels' time intervals over the wall time."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in events
                   if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start)
    busy, end = 0.0, float("-inf")
    for a, b in spans:
        if b > end:
            busy += b - max(a, end)
            end = b
    return busy / wall_us if wall_us > 0 else 0.0


def device_code_paths(trainer) -> None:
    """On a CPU, run what a GPU runs: attention through SDPA, dropout through F.dropout.
    (The CPU's own fast paths read CPU values, free there: the numpy dropout mask's seed,
    the explicit attention's check for empty rows.)"""
    import torch.nn.functional as F

    from transformer.model import dropout as dropout_module
    from transformer.model.attention import set_attention_path

    set_attention_path(trainer.model, True)
    dropout_module.dropout = lambda x, p, training: F.dropout(x, p, training)


def measure(trainer, updates: int) -> dict:
    device = trainer.device
    accum = trainer.tc.accum_steps
    stream = trainer._micro_batches()
    batches = [[b for _ in range(accum) for b in next(stream)[2]] for _ in range(3 + 2 * updates)]
    drive(trainer, batches[:3])  # warm-up: optimizer state, allocator, kernels
    with HostReads(sites=True) as reads:
        drive(trainer, batches[3:3 + updates])
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        drive(trainer, batches[3 + updates:])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - t0
    events = prof.events()
    names = [e.name for e in events]
    aten = sum(n.startswith("aten::") for n in names)
    out = {"updates": updates, "device": str(device), "precision": trainer.tc.precision,
           "host_syncs_per_update": reads.total / updates, "host_reads_by_op": dict(reads.by_op),
           "host_reads_by_site": dict(reads.by_site.most_common(12)),
           "aten_ops_per_update": aten / updates, "ms_per_update_profiled": 1e3 * wall / updates,
           "kernel_launches_per_update": None, "stream_syncs_per_update": None, "gpu_busy_fraction": None}
    if device.type == "cuda":
        out["kernel_launches_per_update"] = sum(n in LAUNCHES for n in names) / updates
        out["stream_syncs_per_update"] = sum(n in SYNCS for n in names) / updates
        out["gpu_busy_fraction"] = round(busy_fraction(events, wall * 1e6), 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--updates", type=int, default=10, help="updates counted, and as many profiled")
    ap.add_argument("--json", default=None, metavar="PATH", help="also write the figures to PATH")
    ap.add_argument("--device-paths", action="store_true",
                    help="on a CPU, take the code paths a GPU takes (SDPA attention, F.dropout)")
    ap.add_argument("overrides", nargs="*", help="mt-train overrides: model=, data=, trainer.*")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_trainer(args.overrides, Path(tmp) / "run")
        if args.device_paths:
            device_code_paths(trainer)
        result = measure(trainer, args.updates)
        result["device_code_paths"] = args.device_paths or trainer.device.type != "cpu"
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
