"""Incremental decoding: the decoder's cache and one decoder step on it.

Shapes: R rows (hypotheses), A sentences, W = R / A rows per sentence (the rows of a
sentence are consecutive), S source length, T new positions (1 in a search), L the cache's
length bound, N decoder layers, H heads, Dh = D / H, D d_model, V vocabulary.

What a step costs is what a GPU pays every step, so the step is built as CTranslate2's and
Hugging Face's static cache are:
- every layer's self-attention keys and values live in one buffer preallocated to the
  length bound, (2N, R, H, L, Dh), and each step writes its new position in place; beam
  search's choice of rows is one `index_select` into a second buffer of the same shape,
  which then takes the first one's place (no allocation in the steady state);
- a single query attends to every cached key, so a step of one token needs no mask (the
  future positions of the buffer are not read: the keys are the written prefix, a view);
- the cross-attention keys and values are projected from the encoder memory once, one
  set per sentence, and a sentence's W rows are read as W queries against them: the
  memory is not needed after the first step, and beams do not copy it;
- q, k and v of self-attention are one matrix product (their weights concatenated once
  per cache), and the target embedding is pre-scaled once per cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from transformer.model.masks import causal_mask, src_key_mask


class Rows:
    """A tensor whose dim 1 holds R rows, kept in one of two buffers of `capacity` rows:
    `select` writes the chosen rows into the other buffer (one `index_select`, no
    allocation) and reads from there on. Only rows beyond the capacity allocate."""

    def __init__(self, full: torch.Tensor, rows: int) -> None:
        self.buffers = [full, torch.empty_like(full)]
        self.current, self.rows = 0, rows

    @property
    def tensor(self) -> torch.Tensor:
        return self.buffers[self.current][:, :self.rows]

    def select(self, index: torch.Tensor) -> None:
        """Keep rows `index` (R',) in that order."""
        rows, full = index.numel(), self.buffers[0]
        target = 1 - self.current
        if rows > full.size(1):  # more rows than ever: grow (the old buffer is still read)
            self.buffers[target] = full.new_empty((full.size(0), rows, *full.shape[2:]))
        torch.index_select(self.tensor, 1, index, out=self.buffers[target][:, :rows])
        if rows > full.size(1):
            self.buffers[self.current] = torch.empty_like(self.buffers[target])
        self.current, self.rows = target, rows


class DecoderCache:
    """State of incremental decoding: every layer's key/value caches.

    Pass an empty `DecoderCache(max_len)` to `Transformer.decode` with the first token(s)
    (and the encoder memory and source ids); each later call feeds only the new tokens
    (memory and source may then be None: the cache holds what it needs of them).
    `reorder(index)` follows beam search's choice of rows.

    Args:
        max_len: L, the most positions it will hold (BOS included); None: the model's
            max_positions.
        max_rows: the most rows it will hold (beam search: sentences x beam size); None:
            the first call's rows. The buffers are allocated at the first call.
    """

    def __init__(self, max_len: int | None = None, max_rows: int | None = None) -> None:
        self.max_len, self.max_rows = max_len, max_rows
        self.length = 0  # positions fed so far
        self.self_kv: Rows | None = None  # (2N, R, H, L, Dh): keys 2i, values 2i + 1
        self.cross_kv: Rows | None = None  # (2N, A, H, S, Dh) of the memory
        self.src_mask: torch.Tensor | None = None  # (A, 1, 1, S)
        self.qkv: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer: (3D, D), (3D,)
        self.embed: torch.Tensor | None = None  # (V, D): target embedding * sqrt(D)
        # Free for a decoder that keeps its ids (the tests' scripted model): rows follow
        # `reorder`. The Transformer needs none: a step attends to every cached key.
        self.tgt_ids: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.length

    def reorder(self, index: torch.Tensor, cross: bool | torch.Tensor = True) -> None:
        """Keep rows `index` (R',), in that order.

        cross: True: the cross-attention caches (one per row) follow `index` as well;
        False: they stay, each row moving to a row of its own sentence (beam search among
        a sentence's beams, or one row fanned out to W); a tensor (A',): the sentences
        kept, in order, with R' / A' rows each.
        """
        if self.self_kv is not None:
            self.self_kv.select(index)
        if self.tgt_ids is not None:
            self.tgt_ids = self.tgt_ids.index_select(0, index)
        if self.cross_kv is not None and cross is not False:
            sentences = index if cross is True else cross
            self.cross_kv.select(sentences)
            self.src_mask = self.src_mask.index_select(0, sentences)

    def start(self, model, rows: int, memory: torch.Tensor, src_ids: torch.Tensor) -> None:
        """Allocate the buffers for `rows` rows and project the memory (B, S, D) once."""
        cfg, layers = model.cfg, model.decoder_layers
        length = min(self.max_len or cfg.max_positions, cfg.max_positions)
        weight = model.tgt_embed.weight
        heads = layers[0].self_attn.n_heads
        dtype = weight.dtype  # under autocast, the dtype its products give
        if torch.is_autocast_enabled(weight.device.type) and dtype == torch.float32:
            dtype = torch.get_autocast_dtype(weight.device.type)
        capacity = max(rows, self.max_rows or 0)
        full = weight.new_zeros(2 * len(layers), capacity, heads, length, cfg.d_model // heads,
                                dtype=dtype)
        self.self_kv = Rows(full, rows)
        self.embed = weight * model.embed_scale
        self.qkv = [_fused_qkv(layer.self_attn) for layer in layers]
        self.src_mask = src_key_mask(src_ids, cfg.pad_id)  # (A, 1, 1, S)
        cross = []
        for layer in layers:
            attn = layer.cross_attn
            cross += [_heads(attn.k_proj(memory), heads), _heads(attn.v_proj(memory), heads)]
        self.cross_kv = Rows(torch.stack(cross), src_ids.size(0))  # (2N, A, H, S, Dh)


def _fused_qkv(attn) -> tuple[torch.Tensor, torch.Tensor]:
    """The q, k and v projections of `attn` as one (3D, D) weight and (3D,) bias."""
    return (torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]),
            torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]))


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, L, D) -> (B, H, L, Dh)."""
    b, n, d = x.shape
    return x.view(b, n, heads, d // heads).transpose(1, 2)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
            use_sdpa: bool) -> torch.Tensor:
    """softmax(q k^T / sqrt(Dh)) v, (B, H, Q, Dh); mask None or bool (.., Q, K), True = may
    attend. Every query here has a key (BOS, or a real source token)."""
    if use_sdpa:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    scores = q @ k.transpose(-2, -1) / q.size(-1) ** 0.5  # (B, H, Q, K)
    if mask is not None:
        scores = scores.masked_fill_(~mask, torch.finfo(scores.dtype).min)
    return scores.softmax(dim=-1) @ v


def _use_sdpa(attn, x: torch.Tensor) -> bool:
    use = x.device.type != "cpu" if attn.use_sdpa is None else attn.use_sdpa
    return use or torch.compiler.is_compiling()


def _self_attention(attn, x: torch.Tensor, kv: torch.Tensor, qkv: tuple[torch.Tensor, torch.Tensor],
                    pos: int) -> torch.Tensor:
    """x (R, T, D) at positions pos..pos+T-1; kv (2, R, H, L, Dh) this layer's cache,
    written in place at those positions. Returns (R, T, D)."""
    r, t, d = x.shape
    h = attn.n_heads
    proj = F.linear(x, *qkv).view(r, t, 3, h, d // h)  # (R, T, 3, H, Dh)
    kv[:, :, :, pos:pos + t] = proj[:, :, 1:].permute(2, 0, 3, 1, 4)  # (2, R, H, T, Dh)
    q = proj[:, :, 0].transpose(1, 2)  # (R, H, T, Dh)
    mask = None if t == 1 else causal_mask(pos + t, x.device, n_queries=t)  # (1, 1, T, pos+T)
    out = _attend(q, kv[0, :, :, :pos + t], kv[1, :, :, :pos + t], mask, _use_sdpa(attn, x))
    return attn.out_proj(out.transpose(1, 2).reshape(r, t, d))


def _cross_attention(attn, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     src_mask: torch.Tensor) -> torch.Tensor:
    """x (R, T, D), k and v (A, H, S, Dh) one per sentence, src_mask (A, 1, 1, S): the W
    rows of a sentence are W * T queries against its keys. Returns (R, T, D)."""
    r, t, d = x.shape
    a, h = k.size(0), attn.n_heads
    q = _heads(attn.q_proj(x.reshape(a, r // a * t, d)), h)  # (A, H, W*T, Dh)
    out = _attend(q, k, v, src_mask, _use_sdpa(attn, x))  # (A, H, W*T, Dh)
    return attn.out_proj(out.transpose(1, 2).reshape(r, t, d))


def _layer_step(layer, x: torch.Tensor, kv: torch.Tensor, cross: torch.Tensor,
                cache: DecoderCache, i: int, pos: int) -> torch.Tensor:
    """Decoder layer i (layers.DecoderLayer) on x (R, T, D) at positions pos..; kv (2, R, H,
    L, Dh) its self-attention cache, cross (2, A, H, S, Dh) its memory's keys and values."""
    x = _residual(layer.self_attn_res, x, lambda h: _self_attention(layer.self_attn, h, kv, cache.qkv[i], pos))
    x = _residual(layer.cross_attn_res, x, lambda h: _cross_attention(
        layer.cross_attn, h, cross[0], cross[1], cache.src_mask))
    return _residual(layer.ffn_res, x, lambda h: _feed_forward(layer.ffn, h))


def _feed_forward(ffn, x: torch.Tensor) -> torch.Tensor:
    """`layers.FeedForward` on x (R, T, D), its first product and ReLU one fused op
    (`torch._addmm_activation`, what nn.TransformerEncoderLayer's fast path runs)."""
    if ffn.training:
        return ffn(x)
    r, t, d = x.shape
    hidden = torch._addmm_activation(ffn.linear1.bias, x.reshape(r * t, d), ffn.linear1.weight.t())
    return ffn.linear2(hidden).view(r, t, d)


def _residual(res, x: torch.Tensor, sublayer) -> torch.Tensor:
    """`layers.Residual` whose sum is written into the sublayer's new output (a step
    allocates no tensor for it); the module itself where dropout is on."""
    if res.training:
        return res(x, sublayer)
    if res.pre_norm:
        return sublayer(res.norm(x)).add_(x)
    return res.norm(sublayer(x).add_(x))


def decode_step(model, tgt_in_ids: torch.Tensor, memory: torch.Tensor | None,
                src_ids: torch.Tensor | None, cache: DecoderCache) -> torch.Tensor:
    """The decoder's states (R, T, D) for the new ids tgt_in_ids (R, T), on `cache`.

    The first call (an empty cache) needs memory (A, S, D) and src_ids (A, S) with
    R a multiple of A; later calls ignore them.
    """
    pos, t = cache.length, tgt_in_ids.size(1)
    if pos + t > model.cfg.max_positions:
        raise ValueError(f"sequence of {pos + t} tokens exceeds model max_positions="
                         f"{model.cfg.max_positions}")
    if cache.self_kv is None:
        if memory is None or src_ids is None:
            raise ValueError("the first decode call on a cache needs the memory and src_ids")
        if memory.shape[:2] != src_ids.shape or tgt_in_ids.size(0) % max(src_ids.size(0), 1):
            raise ValueError(f"shapes disagree: tgt_in_ids {tuple(tgt_in_ids.shape)}, memory "
                             f"{tuple(memory.shape)}, src_ids {tuple(src_ids.shape)}")
        cache.start(model, tgt_in_ids.size(0), memory, src_ids)
    kv = cache.self_kv.tensor  # (2N, R, H, L, Dh)
    if pos + t > kv.size(3):
        raise ValueError(f"the cache holds {kv.size(3)} positions; {pos + t} asked")
    if tgt_in_ids.size(0) != kv.size(1):
        raise ValueError(f"tgt_in_ids has {tgt_in_ids.size(0)} rows, the cache {kv.size(1)}")
    x = F.embedding(tgt_in_ids, cache.embed, model.cfg.pad_id).add_(model.sinusoids[pos:pos + t])
    cross = cache.cross_kv.tensor  # (2N, A, H, S, Dh)
    for i, layer in enumerate(model.decoder_layers):
        x = _layer_step(layer, x, kv[2 * i:2 * i + 2], cross[2 * i:2 * i + 2], cache, i, pos)
    cache.length = pos + t
    return model.decoder_norm(x)
