"""Bounds on the settings that could exhaust the machine, and the memory free for them.

A setting past its bound is refused before any work, naming its key (the `validate` of
each config class calls these): `decode.beam_size` at most MAX_BEAM_SIZE; worker
processes and threads (`data.num_proc`, `trainer.num_threads`, `threads`) at most the
CPU cores this process may use; lengths (`model.max_positions`, `data.max_len`) at most
MAX_POSITIONS; batches (`data.max_tokens`, `trainer.val_max_tokens`, `decode.max_tokens`,
`decode.max_batch_size`) at most MAX_BATCH_TOKENS; `decode.no_repeat_ngram_size` at most
MAX_NO_REPEAT_NGRAM; subword sampling's segmentations kept per sentence
(`data.subword_sampling.segmentations`, each a copy of the sampled sides' ids in the cache
and in memory) at most MAX_SEGMENTATIONS, its n-best list (`.nbest`) at most MAX_NBEST.
Within those, a decoding batch can still ask for more memory than the
machine has: `available_memory` is what is free now, and decoding's own estimate of a
batch's need, which refuses one that would not fit, is in
`transformer/decoding/batch_memory.py` (it needs the typed configs, which this layer-0
module, imported by `config`, may not import).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

MAX_BEAM_SIZE = 128  # fairseq and OpenNMT-py recipes use 4-12; past ~50 BLEU only drops
# `decode.no_repeat_ngram_size`: recipes use 2-4; each step compares every n-gram a row wrote
MAX_NO_REPEAT_NGRAM = 16
MAX_POSITIONS = 16384  # rows of the positional table: longer is a typo, not a model
# Padded tokens in one batch (`data.max_tokens`, `trainer.val_max_tokens`): 16x the largest
# shipped config (8192, the GPU recipes) and 36x the per-GPU batch of Ott et al. 2018
# (3584); a larger batch is `trainer.accum_steps`. Past it the logits alone (tokens x
# vocabulary x 4 bytes, ~17 GB at 131,072 x 32,000) outgrow a CPU's memory before the first
# update, as `4096000` (a typo of a few zeros) would.
MAX_BATCH_TOKENS = 131072
# `decode.sync_every`: steps between the search's reads of the live sentences; the rows
# that finished meanwhile decode that many steps for nothing
MAX_SYNC_EVERY = 64
# `data.subword_sampling.segmentations`: Kudo (2018) samples anew each update; 64 epochs of
# fresh segmentations is more than a run here sees, and 64 copies of Europarl's sources
# (~20M tokens, 2 bytes each) are ~2.5 GB of memory
MAX_SEGMENTATIONS = 64
# `data.subword_sampling.nbest`: Kudo (2018) uses 64; SentencePiece's n-best search costs
# time and memory in proportion per sentence
MAX_NBEST = 1024


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def worker_limit() -> int:
    """The most worker processes or threads a setting may ask for: the cores, at least 2
    (the shipped configs' default, which must run on a one-core machine too)."""
    return max(2, cpu_cores())


def available_memory(device: torch.device) -> int | None:
    """Bytes free for new allocations now: on CUDA the device's free memory plus what
    PyTorch's allocator holds reserved but unused (after training steps that pool can be
    most of the card, and a decoding batch reuses it), else Linux's MemAvailable; None where
    it cannot be known (then nothing is refused)."""
    if device.type == "cuda":
        try:
            unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
            return torch.cuda.mem_get_info(device)[0] + unused
        except RuntimeError:
            return None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
