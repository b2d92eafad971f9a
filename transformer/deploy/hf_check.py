"""What a transformers export computes next to what our model does: the search with
`generate()`, and a teacher-forced pass (`hf_export.py` writes the export).

Shapes: B batch, S source length, T target length, V vocabulary.

`generate()` takes one length limit per call, ours is a * |x| + b per sentence
(`search.max_lengths`): `generate_like` makes one call per limit, so that a sentence that
reaches its limit is closed with a forced EOS at the same step as ours. The model is a
loaded transformers model (`AutoModelForSeq2SeqLM.from_pretrained(export)`) or anything
with its `generate` and `forward`; this module imports nothing from transformers.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from transformer.config import DecodeConfig
from transformer.data.batching import pad
from transformer.decoding.search import max_lengths, search
from transformer.model.transformer import Transformer


@dataclass
class Comparison:
    """How many sentences both searches translated alike, and which did not."""

    equal: int
    total: int
    differing: list[int]  # indices into the compared sources


def generate_like(hf_model, src: list[list[int]], cfg: DecodeConfig, model_cfg) -> list[list[int]]:
    """The best output of `hf_model.generate` for each source (ids without BOS or EOS),
    searched as `cfg` says: greedy, or beam with `cfg.beam_size` scored by the sum of
    log-probabilities (`length_penalty=0`, fairseq's stopping rule), each sentence within
    our length limit and min_len. Sentences of one limit share a padded batch.

    Raises:
        ValueError: beam search with a length penalty, which `generate()` computes
            otherwise than ours (|y| ** alpha, not GNMT's ((5 + |y|) / 6) ** alpha).
    """
    if cfg.method == "beam" and cfg.lenpen != 0:
        raise ValueError(f"decode.lenpen={cfg.lenpen}: generate() matches our beam search "
                         "only without a length penalty (lenpen=0)")
    limits = max_lengths(_Sized(model_cfg), pad(src, model_cfg.pad_id), cfg.max_len_a,
                         cfg.max_len_b, cfg.min_len).tolist()
    groups: dict[int, list[int]] = defaultdict(list)
    for i, limit in enumerate(limits):
        groups[limit].append(i)
    out: list[list[int]] = [[] for _ in src]
    for limit, rows in groups.items():
        src_ids = pad([src[i] for i in rows], model_cfg.pad_id)
        beams = cfg.beam_size if cfg.method == "beam" else 1
        with torch.no_grad():
            generated = hf_model.generate(
                input_ids=src_ids, attention_mask=(src_ids != model_cfg.pad_id).long(),
                num_beams=beams, length_penalty=0.0, early_stopping=True, do_sample=False,
                max_length=limit + 2, min_new_tokens=cfg.min_len)  # BOS, tokens, EOS
        for i, seq in zip(rows, generated.tolist(), strict=True):
            out[i] = _strip(seq, model_cfg)
    return out


def ours(model: Transformer, src: list[list[int]], cfg: DecodeConfig) -> list[list[int]]:
    """Our best output for each source (ids without BOS or EOS), searched as `cfg` says."""
    with torch.no_grad():
        return [n_best[0].tokens for n_best in search(model, pad(src, model.cfg.pad_id), cfg)]


def compare(mine: list[list[int]], theirs: list[list[int]]) -> Comparison:
    differing = [i for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a != b]
    return Comparison(len(mine) - len(differing), len(mine), differing)


def logit_gap(model: Transformer, hf_model, src_ids: torch.Tensor, tgt_in_ids: torch.Tensor) -> float:
    """The largest |difference| of the two models' teacher-forced logits over the target's
    real (non-padding) positions; src_ids (B, S), tgt_in_ids (B, T) right-padded."""
    pad_id = model.cfg.pad_id
    with torch.no_grad():
        mine = model(src_ids, tgt_in_ids)  # (B, T, V)
        theirs = hf_model(input_ids=src_ids, attention_mask=(src_ids != pad_id).long(),
                          decoder_input_ids=tgt_in_ids,
                          decoder_attention_mask=(tgt_in_ids != pad_id).long()).logits
    real = tgt_in_ids != pad_id
    return float((mine - theirs)[real].abs().max())


def _strip(seq: list[int], cfg) -> list[int]:
    """A generated sequence's tokens: without the start token, up to the first EOS."""
    tokens = seq[1:] if seq and seq[0] == cfg.bos_id else seq
    return tokens[: tokens.index(cfg.eos_id)] if cfg.eos_id in tokens else tokens


class _Sized:
    """What `max_lengths` reads of a model: its config."""

    def __init__(self, cfg) -> None:
        self.cfg = cfg
