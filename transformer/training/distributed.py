"""The processes of a training run: the `torchrun` process group, seeds, and RNG states.

`setup_distributed` joins the group `torchrun` describes (NCCL on CUDA, gloo on CPU) and
picks each process's device; `rng_state`/`set_rng_state` carry every RNG the loop touches
through a checkpoint, so a resumed run draws what an uninterrupted one would have.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from transformer.device import resolve_device


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

    NCCL on CUDA, gloo on CPU; one GPU per process (cuda:LOCAL_RANK). A one-process
    `torchrun --nproc_per_node=1` joins a group of one too, so that it runs what several
    processes run (the backend, DistributedDataParallel's gradient all-reduce): on a
    machine with one GPU that is the only way to check the NCCL path.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    info = DistInfo(int(os.environ.get("RANK", "0")), world_size,
                    int(os.environ.get("LOCAL_RANK", "0")))
    device = resolve_device(device_pref, info.local_rank)
    if launched_by_torchrun() and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return info, device


def launched_by_torchrun() -> bool:
    """Whether this process is a worker that `torchrun` (or another env:// launcher) started."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 or all(
        k in os.environ for k in ("RANK", "MASTER_ADDR", "MASTER_PORT"))



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


def token_normaliser(n_tokens: int, info: DistInfo, device: torch.device) -> int | torch.Tensor:
    """What an update's summed loss is divided by: its `n_tokens` target tokens. Under DDP,
    all ranks' tokens over the world size (fairseq's normalisation): DDP averages the
    ranks' gradients, so each rank's loss / (global tokens / world size) makes the update
    the one a single process would make on all the ranks' batches. The sum is an
    all-reduce on the device, never read by the host."""
    if info.world_size == 1:
        return max(n_tokens, 1)
    total = torch.full((), n_tokens, dtype=torch.float32, device=device)
    dist.all_reduce(total)
    return total.clamp(min=1) / info.world_size


def any_rank(flags: tuple[bool, ...], info: DistInfo, device: torch.device) -> tuple[bool, ...]:
    """Each flag, true if it is true on any rank (all ranks stop together; a read of the
    device, so the loop asks only when it reads its metrics anyway)."""
    if info.world_size == 1:
        return flags
    t = torch.tensor([float(f) for f in flags], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return tuple(bool(v) for v in t.tolist())
