"""Where training runs: device, precision, distributed process group, seeds and RNG states."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_distributed(device_pref: str) -> tuple[DistInfo, torch.device]:
    """Join the process group that `torchrun` describes (if any) and pick the device.

    NCCL on CUDA, gloo on CPU; one GPU per process (cuda:LOCAL_RANK).
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    info = DistInfo(int(os.environ.get("RANK", "0")), world_size,
                    int(os.environ.get("LOCAL_RANK", "0")))
    device = resolve_device(device_pref, info.local_rank)
    if world_size > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return info, device


def resolve_device(pref: str, local_rank: int = 0) -> torch.device:
    if pref == "auto":
        return torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    device = torch.device(pref)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"trainer.device={pref} but CUDA is not available")
    if device.type == "cuda" and device.index is None:
        device = torch.device(f"cuda:{local_rank}")
    return device


def keep_large_blocks_in_the_heap() -> bool:
    """Let glibc's malloc reuse large freed blocks instead of returning them to the OS.

    By default glibc maps every block over 32 MiB afresh and unmaps it when freed, so each
    (tokens, vocabulary) tensor of a CPU training step (4k tokens x 8k pieces x 4 bytes =
    131 MB) page-faults its memory in again: on this project's 2-core machine that made
    `log_softmax` on such a tensor 2.5x slower than the arithmetic alone, and a bf16 training
    step about 7% slower (scripts/bench_train.py). The price is that the process keeps its
    peak memory. Used on CPU only; returns whether it applied (glibc's `mallopt`).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_mmap_threshold, 1 << 30)) and bool(libc.mallopt(m_trim_threshold, 2**31 - 1))
    except (OSError, AttributeError):  # not glibc
        return False


def check_precision(precision: str, device: torch.device) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"trainer.precision={precision!r}: choose one of {PRECISIONS}")
    if precision == "fp16" and device.type != "cuda":
        raise ValueError("trainer.precision=fp16 needs CUDA (loss scaling on CPU is not "
                         "supported); use trainer.precision=bf16 on CPU")


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """Mixed-precision context: bf16 on CPU or CUDA, fp16 on CUDA, nothing for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def enable_fast_cuda_math() -> None:
    """TF32 matmuls and convolutions on Ampere and later (fp32 runs only pay for it)."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """Every RNG the training loop touches, as tensors and plain containers."""
    py_version, py_keys, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {  # no numpy arrays: trainer state must load with torch.load(weights_only=True)
        "python": [py_version, list(py_keys), py_gauss],
        "numpy": [np_name, torch.from_numpy(np_keys.astype(np.int64)), np_pos, np_has_gauss, np_gauss],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def setup_logging(log_file: Path | None, is_main: bool) -> None:
    """Log to stderr (and to `log_file`) on rank 0; only warnings on other ranks."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file is not None and is_main:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file))
    logging.basicConfig(
        level=logging.INFO if is_main else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=handlers, force=True,
    )
