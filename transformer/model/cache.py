"""Incremental decoding's cache: every decoder layer's keys and values, preallocated.

Shapes: R rows (hypotheses), A sentences, W = R / A rows per sentence (the rows of a
sentence are consecutive), S source length, L the cache's length bound, N decoder layers,
H heads, Dh = D / H, D d_model, V vocabulary.

What a step costs is what a GPU pays every step, so the cache is laid out as CTranslate2's
and Hugging Face's static caches are:
- every layer's self-attention keys and values live in one buffer preallocated to the
  length bound, (R, 2N, H, L, Dh), rows first so that the first R' rows are one
  contiguous block; each step writes its new position in place (`layers.DecoderLayer.step`);
- the cross-attention keys and values are projected from the encoder memory once, one
  set per sentence, (A, 2N, H, S, Dh); a sentence's W rows are read as W queries against
  them, so the memory is not needed after the first step and beams do not copy it;
- beam search's choice of rows gathers the positions written so far, not the whole length
  bound, into a spare buffer of the same shape (one `index_select`, no allocation).

Two ways to step on it (`Transformer.decode` with a cache, which runs `cached_states`, and
`static_step`), each layer's part `layers.DecoderLayer.step`:
- eager: the position is a Python int and attention reads the written prefix, a view;
  after a reorder the spare buffer takes the first one's place.
- static (`DecoderCache(static=True)`, what `torch.compile` traces): the position is a
  0-d tensor and attention reads all L positions under a position mask, so a batch's
  steps have one shape whatever their position; the buffers never move (a reorder copies
  the gathered prefix back), so CUDA graphs can replay a step on them
  (`torch._dynamo.mark_static_address`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from transformer.model.masks import src_key_mask


class DecoderCache:
    """State of incremental decoding: every layer's key/value caches.

    Pass an empty `DecoderCache(max_len)` to `Transformer.decode` with the first token(s)
    (and the encoder memory and source ids); each later call feeds only the new tokens
    (memory and source may then be None: the cache holds what it needs of them).
    `reorder(rows, sentences)` follows beam search's choice of rows.

    Args:
        max_len: L, the most positions it will hold (BOS included); None: the model's
            max_positions.
        max_rows: the most rows it will hold (beam search: sentences x beam size); None:
            the first call's rows. The buffers are allocated at the first call.
        static: keep every buffer at one address (a reorder copies back into it) and mark
            the buffers static for `torch.compile`: what a step replayed as a CUDA graph needs.
    """

    def __init__(self, max_len: int | None = None, max_rows: int | None = None,
                 static: bool = False) -> None:
        self.max_len, self.max_rows, self.static = max_len, max_rows, static
        self.length = 0  # positions fed so far
        self.rows = 0  # R: rows in use, the first of the buffer's
        self.sentences = 0  # A: sentences in use
        self._kv: torch.Tensor | None = None  # (R_max, 2N, H, L, Dh): keys 2i, values 2i + 1
        self._kv_spare: torch.Tensor | None = None
        self._cross: torch.Tensor | None = None  # (A_max, 2N, H, S, Dh) of the memory
        self._cross_spare: torch.Tensor | None = None
        self._src_mask: torch.Tensor | None = None  # (A_max, 1, 1, S)
        self.qkv: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer: (3D, D), (3D,)
        self.embed: torch.Tensor | None = None  # (V, D): target embedding * sqrt(D)
        self.positions: torch.Tensor | None = None  # (L, L) bool: query i may read keys <= i

    def __len__(self) -> int:
        return self.length

    @property
    def started(self) -> bool:
        return self._kv is not None

    @property
    def kv(self) -> torch.Tensor:
        """(R, 2N, H, L, Dh): the rows in use; layer i's keys [:, 2i], values [:, 2i + 1]."""
        return self._fixed(self._kv[:self.rows])

    @property
    def cross(self) -> torch.Tensor:
        """(A, 2N, H, S, Dh): the memory's keys and values, one set per sentence."""
        return self._fixed(self._cross[:self.sentences])

    @property
    def src_mask(self) -> torch.Tensor:
        """(A, 1, 1, S) bool: the sentences' real source keys."""
        return self._fixed(self._src_mask[:self.sentences])

    def _fixed(self, view: torch.Tensor) -> torch.Tensor:
        """A static cache's view of its first rows (the buffer's address) marked static for
        dynamo: a mark is an attribute of the tensor object, not of its storage."""
        if self.static:
            torch._dynamo.mark_static_address(view)
        return view

    def nbytes(self) -> int:
        """Bytes of the buffers held."""
        held = (self._kv, self._kv_spare, self._cross, self._cross_spare, self._src_mask)
        return sum(t.untyped_storage().nbytes() for t in held if t is not None)

    def reorder(self, rows: torch.Tensor, sentences: torch.Tensor | None = None) -> None:
        """Keep rows `rows` (R',), in that order, and sentences `sentences` (A',): None
        keeps the sentences as they are (beam search among a sentence's beams, or a row
        fanned out to W), each row then moving among its own sentence's rows."""
        self._kv, self._kv_spare = self._gather(self._kv, self._kv_spare, self.rows, rows,
                                                self.length)
        self.rows = rows.numel()
        if sentences is not None:
            self._cross, self._cross_spare = self._gather(
                self._cross, self._cross_spare, self.sentences, sentences, self._cross.size(3))
            mask = self._src_mask[:self.sentences].index_select(0, sentences)
            if self.static:  # read by the step: keep its address too (A' <= A)
                self._src_mask[:mask.size(0)].copy_(mask)
            else:
                self._src_mask = mask
            self.sentences = sentences.numel()

    def _gather(self, buffer: torch.Tensor, spare: torch.Tensor, used: int, index: torch.Tensor,
                positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows `index` of buffer[:used], their first `positions` along dim 3, into the
        spare; returns (the buffer read from now on, the spare). Only more rows than the
        buffers hold allocate (never in a search, whose cache is sized to its rows)."""
        n = index.numel()
        if n > buffer.size(0):
            if self.static:
                raise ValueError(f"a static cache holds {buffer.size(0)} rows; {n} asked")
            spare = buffer.new_zeros((n, *buffer.shape[1:]))
        torch.index_select(buffer[:used, :, :, :positions], 0, index, out=spare[:n, :, :, :positions])
        if self.static:  # the buffer keeps its address: copy back
            buffer[:n, :, :, :positions].copy_(spare[:n, :, :, :positions])
            return buffer, spare
        if n > buffer.size(0):
            buffer = torch.zeros_like(spare)
        return spare, buffer

    def start(self, model, rows: int, memory: torch.Tensor, src_ids: torch.Tensor) -> None:
        """Allocate the buffers for `rows` rows and project the memory (A, S, D) once."""
        cfg, layers = model.cfg, model.decoder_layers
        weight = model.tgt_embed.weight
        heads = layers[0].self_attn.n_heads
        # 2N x (A, S, D), in the dtype the products give (autocast's, where it is on)
        cross = [t for layer in layers for t in layer.cross_attn.memory_kv(memory)]
        a, s, d = memory.shape
        cross = torch.stack(cross, dim=1).view(a, len(cross), s, heads, d // heads).transpose(2, 3)
        self.allocate(rows, cross, src_key_mask(src_ids, cfg.pad_id), min(self.max_len or cfg.max_positions,
                      cfg.max_positions))
        self.embed = weight * model.embed_scale
        self.qkv = [layer.self_attn.fused_qkv() for layer in layers]
        if self.static:
            for tensor in (self.embed, *(w for pair in self.qkv for w in pair)):
                torch._dynamo.mark_static_address(tensor)  # read by every step, never moved

    def allocate(self, rows: int, cross: torch.Tensor, src_mask: torch.Tensor, length: int) -> None:
        """The buffers for `rows` rows of `length` positions, shaped after `cross` (A, 2N,
        H, S, Dh), the memory's keys and values (kept), and src_mask (A, 1, 1, S)."""
        capacity = max(rows, self.max_rows or 0)
        # zeros, the spare too: a step reads every position under its mask, and 0 * NaN is
        # NaN (after a reorder the positions past the prefix are the spare's)
        self._kv = cross.new_zeros(capacity, *cross.shape[1:3], length, cross.size(4))
        self._kv_spare = torch.zeros_like(self._kv)
        self._cross, self._cross_spare = cross, torch.empty_like(cross)
        self._src_mask = src_mask
        self.rows, self.sentences = rows, cross.size(0)
        self.positions = torch.ones(length, length, dtype=torch.bool, device=cross.device).tril_()


def cached_states(model, tgt_in_ids: torch.Tensor, memory: torch.Tensor | None,
                   src_ids: torch.Tensor | None, cache: DecoderCache) -> torch.Tensor:
    """The decoder's states (R, T, D) for the new ids tgt_in_ids (R, T), on `cache`
    (eager: the position is the cache's length, an int). The first call (an empty
    cache) needs memory (A, S, D) and src_ids (A, S) with R a multiple of A; later
    calls ignore them."""
    pos, t = cache.length, tgt_in_ids.size(1)
    if pos + t > model.cfg.max_positions:
        raise ValueError(f"sequence of {pos + t} tokens exceeds model max_positions="
                         f"{model.cfg.max_positions}")
    if not cache.started:
        if memory is None or src_ids is None:
            raise ValueError("the first decode call on a cache needs the memory and src_ids")
        if memory.shape[:2] != src_ids.shape or tgt_in_ids.size(0) % max(src_ids.size(0), 1):
            raise ValueError(f"shapes disagree: tgt_in_ids {tuple(tgt_in_ids.shape)}, memory "
                             f"{tuple(memory.shape)}, src_ids {tuple(src_ids.shape)}")
        cache.start(model, tgt_in_ids.size(0), memory, src_ids)
    kv = cache.kv  # (R, 2N, H, L, Dh)
    if pos + t > kv.size(3):
        raise ValueError(f"the cache holds {kv.size(3)} positions; {pos + t} asked")
    if tgt_in_ids.size(0) != kv.size(0):
        raise ValueError(f"tgt_in_ids has {tgt_in_ids.size(0)} rows, the cache {kv.size(0)}")
    x = F.embedding(tgt_in_ids, cache.embed, model.cfg.pad_id).add_(model.sinusoids[pos:pos + t])
    cross, src_mask = cache.cross, cache.src_mask  # (A, 2N, H, S, Dh), (A, 1, 1, S)
    mask = cache.positions[pos:pos + t][None, None]  # (1, 1, T, L)
    for i, layer in enumerate(model.decoder_layers):
        x = layer.step(x, kv[:, 2 * i:2 * i + 2], cross[:, 2 * i:2 * i + 2], src_mask, pos,
                       mask, cache.qkv[i])
    cache.length = pos + t
    return model.decoder_norm(x)


def static_step(model, tgt_ids: torch.Tensor, pos: torch.Tensor, kv: torch.Tensor,
                cross: torch.Tensor, src_mask: torch.Tensor, embed: torch.Tensor,
                qkv: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """One decoding step of fixed shape, what `torch.compile` traces: the new ids
    tgt_ids (R, 1) at position pos (a 0-d long tensor) on a static `DecoderCache`'s
    `kv` (R, 2N, H, L, Dh), written at pos, `cross` (A, 2N, H, S, Dh), `src_mask`
    (A, 1, 1, S), `embed` and `qkv`. Returns the next token's log-probabilities (R, V),
    float32: the arithmetic of `decode` on the cache and `log_softmax`, op for op.

    Nothing here reads a Python number that changes from step to step: a batch's steps
    share one graph and, on buffers that never move, one CUDA graph per row count. The
    caller advances pos and the cache's length."""
    x = F.embedding(tgt_ids, embed, model.cfg.pad_id)  # (R, 1, D)
    x = torch.add(x, model.sinusoids.index_select(0, pos.view(1))).to(x.dtype)
    mask = (torch.arange(kv.size(3), device=kv.device) <= pos).view(1, 1, 1, -1)  # (1, 1, 1, L)
    for i, layer in enumerate(model.decoder_layers):
        x = layer.step(x, kv[:, 2 * i:2 * i + 2], cross[:, 2 * i:2 * i + 2], src_mask, pos,
                       mask, qkv[i])
    logits = model.out_proj(model.decoder_norm(x))[:, -1]  # (R, V)
    return torch.log_softmax(logits, dim=-1, dtype=torch.float32)  # the cast fused when compiled
