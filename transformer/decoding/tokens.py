"""Token-level detail of chosen translations: each piece's log-probability and the
source->target attention, from one teacher-forced pass over the hypotheses.

Shapes: B batch (pairs), S source length, T target length + 1 (BOS in, EOS out), V
vocabulary, H heads, D d_model.

    found = token_details(model, src, tgt, cfg, device, attention=True)
    found[0].log_probs   # one per target token, then the EOS: their sum is the raw score
    found[0].attention   # (T, S) rows: each target token's (and the EOS's) weights

The search's constraints (min_len, the length limit, a forced prefix, no repeated
n-grams) choose tokens but never change a chosen token's log-probability, so teacher
forcing the search's own tokens gives each piece's log-probability as the search
counted it: the sum of `log_probs` over GNMT's length penalty is the hypothesis' score.

Attention: the cross-attention of the last decoder layer, averaged over its heads
(fairseq's default alignment layer), rows summing to 1 over the real source pieces. It
is computed beside the model's forward, from the model's own modules, without setting
anything on them (`MultiHeadAttention.store_weights` would be state shared by every
thread that uses the model). An export gives log-probabilities only
(`ct2_model.CT2Model.log_probs`: CTranslate2's `score_batch`, with min_len's
renormalisation as `scoring.unit_scores` adds it); its attention is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from transformer.config import ConfigError
from transformer.data.batching import length_batches, pad
from transformer.decoding.ct2_model import CT2Model
from transformer.decoding.search import logsumexp
from transformer.model.attention import attention_weights, autocast_input
from transformer.model.masks import src_key_mask, tgt_self_mask


@dataclass
class TokenDetail:
    """One hypothesis' detail: log_probs, len(target) + 1 (EOS last); attention, None or
    len(target) + 1 rows of len(source) weights."""

    log_probs: list[float]
    attention: list[list[float]] | None = None


def token_details(model, src: Sequence[list[int]], tgt: Sequence[list[int]], batch_tokens: int,
                  device: torch.device, attention: bool = False,
                  min_len: int = 0) -> list[TokenDetail]:
    """The detail of each target `tgt[i]` (ids, no BOS or EOS) for source `src[i]`.

    Our model runs in the mode and precision the caller set up (`Translator` does),
    batched by length to `batch_tokens`; an export (`CT2Model`) through `score_batch`, with
    `min_len` its search's EOS masking (module docstring).

    Raises:
        ConfigError: attention asked of an export.
    """
    check_attention(model, attention)
    if isinstance(model, CT2Model):
        return [TokenDetail(lp) for lp in model.log_probs(list(src), list(tgt), min_len)]
    found: list[TokenDetail] = [TokenDetail([]) for _ in src]
    lengths = [max(len(s), len(t) + 1, 1) for s, t in zip(src, tgt, strict=True)]
    for batch in length_batches(lengths, batch_tokens):
        for i, detail in zip(batch, _forced(model, [src[i] for i in batch], [tgt[i] for i in batch],
                                            device, attention), strict=True):
            found[i] = detail
    return found


def check_attention(model, attention: bool) -> None:
    """ConfigError where attention is asked of an export (module docstring)."""
    if attention and isinstance(model, CT2Model):
        raise ConfigError("return_attention=True: an exported model gives no attention here "
                          "(CTranslate2's score_batch returns none); use the checkpoint")


def _forced(model, src: list[list[int]], tgt: list[list[int]], device: torch.device,
            attention: bool) -> list[TokenDetail]:
    """One batch's teacher-forced log-probabilities (and attention); one read-back."""
    cfg = model.cfg
    src_ids = pad([s or [cfg.pad_id] for s in src], cfg.pad_id).to(device)  # (B, S)
    tgt_in = pad([[cfg.bos_id, *t] for t in tgt], cfg.pad_id).to(device)  # (B, T)
    tgt_out = pad([[*t, cfg.eos_id] for t in tgt], cfg.pad_id).to(device)  # (B, T)
    logits, weights = _decode_with_attention(model, src_ids, tgt_in, attention)  # (B, T, V)
    logits = logits.float()
    picked = logits.gather(2, tgt_out[..., None]).squeeze(2)  # (B, T)
    log_probs = picked - logsumexp(logits.flatten(0, 1)).view_as(picked)  # (B, T)
    rows = log_probs.double().tolist()
    maps = weights.tolist() if weights is not None else None
    out = []
    for b, (s, t) in enumerate(zip(src, tgt, strict=True)):
        rows_b = [row[:len(s)] for row in maps[b][:len(t) + 1]] if maps is not None else None
        out.append(TokenDetail(rows[b][:len(t) + 1], rows_b))
    return out


def _decode_with_attention(model, src_ids: torch.Tensor, tgt_in: torch.Tensor,
                           attention: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits (B, T, V) as `model(src_ids, tgt_in)` gives them and, if asked, the last
    decoder layer's cross-attention averaged over heads (B, T, S), float32.

    The decoder runs layer by layer so that the last layer's cross-attention input can
    be recomputed (its self-attention sub-block, then the pre-norm LayerNorm where the
    model has one) and its weights taken with `attention_weights`, as the module's
    explicit path computes them."""
    if not attention:
        return model(src_ids, tgt_in), None
    cfg = model.cfg
    memory = autocast_input(model.encode(src_ids))  # (B, S, D)
    tgt_mask = tgt_self_mask(tgt_in, cfg.pad_id)  # (B, 1, T, T)
    src_mask = src_key_mask(src_ids, cfg.pad_id)  # (B, 1, 1, S)
    x = model._embed(model.tgt_embed, tgt_in, "tgt_in_ids")  # (B, T, D)
    *layers, last = model.decoder_layers
    for layer in layers:
        x = layer(x, memory, tgt_mask, src_mask)
    h = last.self_attn_res(x, lambda y: last.self_attn(y, y, tgt_mask))  # (B, T, D)
    if last.cross_attn_res.pre_norm:
        h = last.cross_attn_res.norm(h)
    attn = last.cross_attn
    q = attn._heads(attn.q_proj(autocast_input(h)))  # (B, H, T, Dh)
    k = attn._heads(attn.k_proj(memory))  # (B, H, S, Dh)
    weights = attention_weights(q, k, src_mask).float().mean(dim=1)  # (B, T, S)
    x = last(x, memory, tgt_mask, src_mask)
    return model.out_proj(model.decoder_norm(x)), weights


def alignment(attention: list[list[float]], n_tokens: int) -> list[int]:
    """The argmax source piece of each of the first `n_tokens` attention rows (the target
    pieces; the EOS row is left out)."""
    return [max(range(len(row)), key=row.__getitem__) if row else -1 for row in attention[:n_tokens]]


def line_details(model, tokenizer, units: Sequence, found: Sequence[Sequence], batch_tokens: int,
                 device: torch.device, attention: bool = False,
                 min_len: int = 0) -> list[list[dict]]:
    """Per line, per entry of its n-best list `found[line]`, the token-level fields of a
    `Translation`: tokens, token_scores, segments and, with `attention`, source_tokens,
    attention and alignment; the line's sentences (`units`, `text.Unit`s in reading order)
    one after another (see `Translation`)."""
    pairs = [(u, k) for u, unit in enumerate(units) for k in range(len(found[unit.line]))
             if unit.src]
    got = token_details(model, [units[u].src for u, _ in pairs],
                        [units[u].hyps[k] for u, k in pairs], batch_tokens, device, attention,
                        min_len)
    detail = dict(zip(pairs, got, strict=True))
    by_line: list[list[int]] = [[] for _ in found]
    for u, unit in enumerate(units):
        by_line[unit.line].append(u)
    out = []
    for line, hyps in enumerate(found):
        src_len = sum(len(units[u].src) for u in by_line[line])
        entries = []
        for k in range(len(hyps)):
            entry: dict = {"tokens": [], "token_scores": [], "segments": []}
            if attention:
                entry.update(source_tokens=[], attention=[], alignment=[])
            offset = 0
            for u in by_line[line]:
                unit = units[u]
                if not unit.src:
                    continue
                ids, d = unit.hyps[k], detail[u, k]
                entry["tokens"] += [tokenizer.id_to_piece(i) for i in ids]
                entry["token_scores"] += d.log_probs
                entry["segments"].append(len(ids))
                if attention:
                    entry["source_tokens"] += [tokenizer.id_to_piece(i) for i in unit.src]
                    width = len(unit.src)
                    entry["attention"] += [[0.0] * offset + row + [0.0] * (src_len - offset - width)
                                           for row in d.attention]
                    entry["alignment"] += [offset + j for j in alignment(d.attention, len(ids))]
                    offset += width
            entries.append(entry)
        out.append(entries)
    return out
