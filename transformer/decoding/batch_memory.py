"""What a decoding batch needs in memory, and the refusal of one that would not fit.

Within the bounds on its settings (`transformer/bounds.py`: `decode.beam_size` at most
128), a decoding batch can still ask for more memory than the machine has (beam 128 over
a batch of 2,000 one-token sentences is 256,000 rows of a vocabulary-sized score vector):
`check_decode_memory` estimates the largest batch's need before the first one runs and
refuses it, in one line naming `decode.beam_size` and `decode.batch_tokens`, where it
exceeds the memory free now (`bounds.available_memory`). On a GPU, `decode_batch_tokens`
sizes the default batch to the memory free.
"""

from __future__ import annotations

import torch

from transformer import bounds
from transformer.config import DecodeConfig, ModelConfig
from transformer.errors import ConfigError


def decode_cache_bytes(model_cfg: ModelConfig, n_sentences: int, src_len: int, beam: int, max_len: int,
                       act_bytes: int) -> int:
    """The bytes of a decoding batch's `DecoderCache` (model/cache.py): R = sentences x
    beam rows of self-attention keys and values for L = max_len + 1 positions per decoder
    layer, twice (the buffer and the spare a reorder gathers into), and the memory's keys
    and values, once per sentence, twice likewise; the position mask beside them."""
    rows, layers, d = n_sentences * beam, model_cfg.n_decoder_layers, model_cfg.d_model
    length = max_len + 1  # BOS and up to max_len tokens
    self_kv = 2 * rows * 2 * layers * length * d * act_bytes
    cross = 2 * n_sentences * 2 * layers * src_len * d * act_bytes
    return self_kv + cross + n_sentences * src_len + length * length  # + the bool masks


def decode_batch_bytes(model_cfg: ModelConfig, n_sentences: int, src_len: int, beam: int, max_len: int,
                       act_bytes: int) -> int:
    """An upper estimate of what one decoding batch allocates beyond the weights: its
    cache (`decode_cache_bytes`), each row's scores over the vocabulary (the logits in the
    compute dtype, and in fp32 the log-probabilities and the top-k's working copy), and the
    encoder output."""
    rows = n_sentences * beam
    scores = rows * model_cfg.vocab_size * (act_bytes + 2 * 4)
    memory = n_sentences * src_len * model_cfg.d_model * act_bytes
    return decode_cache_bytes(model_cfg, n_sentences, src_len, beam, max_len, act_bytes) + scores + memory


def decode_batch_tokens(model_cfg: ModelConfig, cfg: DecodeConfig, free: int | None, floor: int,
                        ceiling: int, share: float = 0.5) -> int:
    """The source tokens a decoding batch may hold on a device with `free` bytes free: the
    largest of floor, 2 * floor, ... up to ceiling whose worst batch fits in `share` of it.

    The worst batch of a budget T is, over every source length l the model takes, T // l
    sentences of length l (`length_batches` pads each batch to its longest), estimated by
    `decode_batch_bytes`; short sentences are the worst (one row of vocabulary-sized scores
    each per beam). `free` None (unknown): floor. cfg: the resolved DecodeConfig.
    """
    if free is None:
        return floor
    beam = cfg.beam_size if cfg.method == "beam" else 1
    act_bytes = 2 if cfg.precision in ("bf16", "fp16") else 4
    limit = model_cfg.max_positions - 1

    def worst(tokens: int) -> int:
        return max(decode_batch_bytes(model_cfg, max(1, tokens // n), n, beam,
                                      min(limit, max(cfg.min_len, int(cfg.max_len_a * n + cfg.max_len_b))),
                                      act_bytes)
                   for n in range(1, min(tokens, model_cfg.max_positions) + 1))

    best = floor
    while best * 2 <= ceiling and worst(best * 2) <= share * free:
        best *= 2
    return best


def check_decode_memory(model_cfg: ModelConfig, batches: list[list[int]], cfg: DecodeConfig,
                        device: torch.device) -> None:
    """Refuse (ConfigError) decoding whose largest batch would need more memory than is free.

    batches: the source lengths of each decoding batch; cfg: the resolved DecodeConfig."""
    free = bounds.available_memory(device)
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
            f"decode.beam_size={cfg.beam_size} with decode.batch_tokens={cfg.batch_tokens}: a decoding "
            f"batch of {len(worst)} sentences x beam {beam} would need about {_gb(need(worst))} of "
            f"memory, and {_gb(free)} is free on {device.type}: lower decode.beam_size or "
            "decode.batch_tokens")


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB"
