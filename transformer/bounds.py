"""Bounds on the settings that could exhaust the machine, and decoding's memory estimate.

A setting past its bound is refused before any work, naming its key (the `validate` of
each config class calls these): `decode.beam_size` at most MAX_BEAM_SIZE; worker
processes and threads (`data.num_proc`, `trainer.num_threads`, `threads`) at most the
CPU cores this process may use; lengths (`model.max_positions`, `data.max_len`) at most
MAX_POSITIONS; batches (`data.max_tokens`, `trainer.val_max_tokens`) at most MAX_BATCH_TOKENS. Within those, a decoding batch can still ask for more memory than the
machine has (beam 128 over a batch of 2,000 one-token sentences is 256,000 rows of a
vocabulary-sized score vector): `check_decode_memory` estimates the largest batch's
need and refuses it, in one line, where it exceeds the memory free now.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from transformer.errors import ConfigError

MAX_BEAM_SIZE = 128  # fairseq and OpenNMT-py recipes use 4-12; past ~50 BLEU only drops
MAX_POSITIONS = 16384  # rows of the positional table: longer is a typo, not a model
# Padded tokens in one batch (`data.max_tokens`, `trainer.val_max_tokens`): 16x the largest
# shipped config (8192, the GPU recipes) and 36x the per-GPU batch of Ott et al. 2018
# (3584); a larger batch is `trainer.accum_steps`. Past it the logits alone (tokens x
# vocabulary x 4 bytes, ~17 GB at 131,072 x 32,000) outgrow a CPU's memory before the first
# update, as `4096000` (a typo of a few zeros) would.
MAX_BATCH_TOKENS = 131072


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


def decode_batch_bytes(model_cfg, n_sentences: int, src_len: int, beam: int, max_len: int,
                       act_bytes: int) -> int:
    """An upper estimate of what one decoding batch allocates beyond the weights:
    R = sentences x beam rows, each with its scores over the vocabulary (logits,
    log-softmax and the top-k's copy, in fp32), a key and a value per decoder layer for
    each of its up to `max_len` output tokens (self-attention cache) and `src_len`
    source tokens (cross-attention cache, fanned out per beam), and the encoder output."""
    rows = n_sentences * beam
    d, layers = model_cfg.d_model, model_cfg.n_decoder_layers
    scores = 3 * model_cfg.vocab_size * 4
    caches = layers * 2 * (max_len + src_len) * d * act_bytes
    return rows * (scores + caches + src_len * d * act_bytes)


def check_decode_memory(model_cfg, batches: list[list[int]], cfg, device: torch.device) -> None:
    """Refuse (ConfigError) decoding whose largest batch would need more memory than is free.

    batches: the source lengths of each decoding batch; cfg: the resolved DecodeConfig."""
    free = available_memory(device)
    if free is None or not batches:
        return
    beam = cfg.beam_size if cfg.method == "beam" else 1
    act_bytes = 2 if cfg.precision in ("bf16", "fp16") else 4
    limit = model_cfg.max_positions - 1

    def need(lengths: list[int]) -> int:
        longest = max(lengths)
        max_len = min(limit, max(cfg.min_len, int(cfg.max_len_a * longest + cfg.max_len_b)))
        return decode_batch_bytes(model_cfg, len(lengths), longest, beam, max_len, act_bytes)

    worst = max(batches, key=need)
    if need(worst) > free:
        raise ConfigError(
            f"decode.beam_size={cfg.beam_size} with decode.max_tokens={cfg.max_tokens}: a decoding "
            f"batch of {len(worst)} sentences x beam {beam} would need about {_gb(need(worst))} of "
            f"memory, and {_gb(free)} is free on {device.type}: lower decode.beam_size or "
            "decode.max_tokens")


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB"
