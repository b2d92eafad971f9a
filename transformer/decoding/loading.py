"""The commands' loader: a checkpoint directory or a CTranslate2 export, ready to decode.

    model, tokenizer, device = load_for_inference("runs/x/checkpoints/best", "auto", dtype="auto")

`mt-translate`, `mt-evaluate`, `mt-masks` and the scripts load through it; on a CPU it
also sets what holds for the whole process (glibc's allocator options, torch's threads),
which a library user's `Translator.load` (translator.py) never does. `text.py`
re-exports it, where scripts and the shared tools import it from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from transformer.checkpoint import CheckpointError, load_model
from transformer.config import ConfigError, DecodeConfig
from transformer.data.tokenizer import Tokenizer
from transformer.decoding.ct2_model import CT2Model, is_export, load_export
from transformer.decoding.settings import DTYPES, decode_precision
from transformer.device import keep_large_blocks_in_the_heap, resolve_device

if TYPE_CHECKING:  # load_for_inference's return type (the graph counts no import here)
    from transformer.model.transformer import Transformer


def load_for_inference(
    checkpoint: str | None, device_pref: str, threads: int | None = None, dtype: str | None = None,
) -> tuple[Transformer | CT2Model, Tokenizer, torch.device]:
    """(model, tokenizer, device) from a checkpoint directory or a CTranslate2 export.

    The commands' loader: on a CPU it also sets what holds for the whole process, glibc's
    allocator options (`device.keep_large_blocks_in_the_heap`) and torch's threads; a
    library user's `Translator.load` sets neither.

    threads: CPU threads (torch's for a checkpoint; for an export on a CPU, that many
    single-threaded CTranslate2 workers, `ct2_model.CT2Model`); None: torch's default,
    and 2 for an export.

    Args:
        checkpoint: a checkpoint directory, or a directory written by mt-export (it holds
            export.json).
        device_pref: `auto`, `cpu`, `cuda` or `cuda:N` (mt-translate's `device`).
        threads: CPU threads; for a checkpoint `torch.set_num_threads`, which holds for
            the whole process.
        dtype: the weights' dtype, that of the precision the model will decode in:
            `auto` (`settings.decode_precision`'s choice), `fp32`, `bf16` or `fp16`
            (CUDA); None: as saved (fp32). A model decoded in another precision gets
            copies of its weights for each call (`weights.held_in`). Not for an export.

    Returns:
        model: a `Transformer` in eval mode on the device, or a `CT2Model`.
        tokenizer: its tokenizer.
        device: the torch device it runs on.

    Raises:
        CheckpointError: no checkpoint given, or one that is missing, incomplete or
            corrupt (the message names the file).
        ConfigError: a device this machine does not have, a corrupt export, an export
            without ctranslate2 installed, or a dtype the device cannot run.
    """
    if not checkpoint:
        raise CheckpointError("no checkpoint given: add checkpoint=path/to/checkpoint_dir")
    if is_export(checkpoint):
        if dtype not in (None, "auto"):
            raise ConfigError(f"dtype={dtype}: an export computes in the type it was exported "
                              "with; leave dtype=auto")
        return load_export(checkpoint, device_pref, threads)
    device = resolve_device(device_pref, key="device")
    held = None if dtype is None else DTYPES[decode_precision(dtype, device, key="dtype")]
    if device.type == "cpu":
        keep_large_blocks_in_the_heap()
        if threads is not None:
            torch.set_num_threads(threads)
    model, tokenizer = load_model(checkpoint, device)
    return (model if held is None else model.to(held)), tokenizer, device


def in_decode_dtype(model: Transformer | CT2Model, decode: DecodeConfig) -> Transformer | CT2Model:
    """`model` with its weights in the dtype of `decode`'s resolved precision
    (`settings.decode_settings`): a command casts them once, so that no batch or window
    casts them again (`weights.held_in` finds them there). An export as it is."""
    return model if isinstance(model, CT2Model) else model.to(DTYPES[decode.precision])
