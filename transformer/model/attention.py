"""Multi-head attention (Vaswani et al. 2017, section 3.2) with a key/value cache.

Shapes: B batch, T query length, S key length, D d_model, H heads, Dh = D / H.

Masks arrive as bool tensors (True = may attend) that broadcast against (B, H, T, S);
see `masks.py`. They become scores here and nowhere else: the fused path (CUDA) hands the
bool mask to `F.scaled_dot_product_attention` (which adds -inf before the softmax, and
lets CUDA choose a fused kernel); the explicit path (CPU, and wherever the weights are
wanted) does `masked_fill(~mask, finfo.min)` before the softmax.

A query row whose keys are all masked (an all-padding sequence) would be a softmax over
nothing, i.e. 0/0 = NaN. Such rows are opened to every key for the computation and
their output is then set to exactly zero, in every dtype.

The model's full-sequence forward (training, teacher forcing) takes two shortcuts that
leave every real output as the masks define it:
- decoder self-attention (`causal=True`) reaches SDPA as `is_causal` with no mask, which
  its flash kernel takes. Targets are right-padded, so a real query's causal keys are all
  real; a padded query may read padded keys, and is never predicted. The explicit path
  (and stored weights) applies the full mask, causal AND key padding.
- source key padding reaches SDPA as an additive bias (`key_bias`, built once per
  forward in the compute dtype, the form SDPA's fused kernels read without a conversion
  per call), with an all-padding source's row opened to every key: no row is empty, so no
  call pays for the empty-row bookkeeping (such a sentence's outputs are finite, not
  zero). The module still receives the bool mask, which the explicit path applies.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from transformer.model.dropout import dropout


def autocast_input(x: torch.Tensor) -> torch.Tensor:
    """x in autocast's lower precision when autocast is on, else x itself.

    Autocast casts a float32 input separately for every matmul that reads it: the q, k
    and v projections of a LayerNorm's fp32 output would be three casts forward and three
    backward, and the encoder memory two in every decoder layer. Casting once before them
    makes that one (the same values: each cast rounds the same way).
    """
    device = x.device.type
    if x.dtype == torch.float32 and torch.is_autocast_enabled(device):
        return x.to(torch.get_autocast_dtype(device))
    return x


def key_bias(key_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, 1, 1, S) bool key mask -> (B, 1, 1, S) additive bias in `dtype`: 0 where a key
    may be read, -inf where not, and 0 across a row with no key at all (an all-padding
    sequence), so that no row of the scores is empty."""
    open_mask = key_mask | ~key_mask.any(dim=-1, keepdim=True)
    return torch.zeros(open_mask.shape, dtype=dtype, device=key_mask.device).masked_fill_(
        ~open_mask, float("-inf"))


def _open_empty_rows(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (mask with all-False rows set to True, (.., T, 1) bool of non-empty rows)."""
    has_key = mask.any(dim=-1, keepdim=True)
    return mask | ~has_key, has_key


def attention_weights(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Explicit softmax(q k^T / sqrt(Dh) + mask) -> (B, H, T, S); empty rows are zeros."""
    scores = q @ k.transpose(-2, -1) / q.size(-1) ** 0.5  # (B, H, T, S)
    open_mask, has_key = _open_empty_rows(mask)
    weights = scores.masked_fill_(~open_mask, torch.finfo(scores.dtype).min).softmax(dim=-1)
    # Only an all-padding sequence has empty rows (training batches never do): skip the
    # pass over the weights, and its backward, when every row has a key.
    return weights if bool(has_key.all()) else weights.masked_fill(~has_key, 0.0)


class MultiHeadAttention(nn.Module):
    """Multi-head attention; the same module serves self- and cross-attention."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.store_weights = False  # set True to keep `self.weights` (B, H, T, S)
        # None: F.scaled_dot_product_attention on CUDA (given a mask, as here, its
        # memory-efficient kernel, or the math one where that cannot run; never flash, which
        # takes no mask), the explicit product on CPU. On CPU the explicit product is SDPA's
        # math kernel without its scaling of a transposed copy of K, which on a decoding step
        # (one query per row against every cached key) costs more than the product itself
        # (docs/results/code-figures.md, "Figures behind the code's choices"); SDPA's fused CPU kernel is
        # slower still on sentence-length sequences. True/False force a path (tests use both on CPU).
        self.use_sdpa: bool | None = None
        self.weights: torch.Tensor | None = None

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, D) -> (B, H, L, Dh)."""
        b, n, d = x.shape
        return x.view(b, n, self.n_heads, d // self.n_heads).transpose(1, 2)

    def forward(
        self,
        x: torch.Tensor,
        kv: torch.Tensor,
        mask: torch.Tensor,
        causal: bool = False,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attend from queries x (B, T, D) to keys/values kv (B, S, D).

        mask: bool, broadcastable to (B, H, T, S), True = may attend. (Incremental
        decoding takes `step` and `step_cross` instead.) causal: mask is
        causal AND the key padding of a whole right-padded sequence (kv is x): SDPA runs
        `is_causal` without it (the same real outputs). bias: `key_bias(mask)`, built once
        by the caller for every layer: what SDPA reads instead of the mask.
        Returns (B, T, D).
        """
        if kv is x:  # self-attention: one cast serves q, k and v
            x = kv = autocast_input(x)
        else:
            x, kv = autocast_input(x), autocast_input(kv)
        q, k, v = self._projections(x, kv)  # (B, H, T|S, Dh)
        p = self.dropout if self.training else 0.0
        use_sdpa = self._sdpa(q)
        if self.store_weights or not use_sdpa:
            w = attention_weights(q, k, mask)
            if self.store_weights:
                self.weights = w.detach()
            out = dropout(w, p, self.training) @ v  # the cheap CPU mask (dropout.py)
        elif causal:  # every real query's causal keys are real: no mask, no empty row
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        elif bias is not None:  # no empty row: nothing to mend
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p)
        else:  # CUDA: SDPA with a mask, so the memory-efficient kernel (flash takes no mask)
            open_mask, has_key = _open_empty_rows(mask)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=open_mask, dropout_p=p)
            out = out.masked_fill(~has_key, 0.0)  # rows with no key: zeros, not NaN
        b, _, t, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, t, -1))

    def _projections(self, x: torch.Tensor, kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v (B, H, L, Dh) of a whole sequence: one product for the projections that
        read the same input (q, k, v in self-attention; k, v of the memory), its backward
        one product for the weights and one for the input instead of one each."""
        proj = (self.q_proj, self.k_proj, self.v_proj) if kv is x else (self.k_proj, self.v_proj)
        weight = torch.cat([m.weight for m in proj])  # (n D, D)
        bias = torch.cat([m.bias for m in proj])
        fused = [self._heads(h) for h in F.linear(kv, weight, bias).chunk(len(proj), dim=-1)]
        if kv is x:
            return fused[0], fused[1], fused[2]
        return self._heads(self.q_proj(x)), fused[0], fused[1]

    # Incremental decoding (`layers.DecoderLayer.step`, on a `cache.DecoderCache`): R rows,
    # T new positions (1 in a search), L the cache's length bound, A sentences.

    def fused_qkv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The q, k and v projections as one (3D, D) weight and (3D,) bias."""
        proj = (self.q_proj, self.k_proj, self.v_proj)
        return torch.cat([m.weight for m in proj]), torch.cat([m.bias for m in proj])

    def memory_kv(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention's keys and values of the memory (A, S, D), each (A, S, D): once
        per decoding."""
        return self.k_proj(memory), self.v_proj(memory)

    def step(self, x: torch.Tensor, kv: torch.Tensor, pos: int | torch.Tensor, mask: torch.Tensor,
             qkv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Self-attention of x (R, T, D) at positions pos..pos+T-1 on kv (R, 2, H, L, Dh),
        this layer's cached keys and values, written here at those positions.

        Every query reads all L cached positions under `mask` (1, 1, T, L), True where a
        key's position is at most the query's: one shape whatever the position, and the
        same arithmetic eagerly and compiled. pos: an int (eager), or a 0-d long tensor
        (T = 1: the static step `torch.compile` traces, which reads no Python number that
        changes from step to step). qkv: `fused_qkv()`, made once per decoding.
        Returns (R, T, D).
        """
        r, t, d = x.shape
        h = self.n_heads
        proj = F.linear(x, *qkv).view(r, t, 3, h, d // h)  # (R, T, 3, H, Dh)
        new = proj[:, :, 1:].permute(0, 2, 3, 1, 4)  # (R, 2, H, T, Dh)
        if isinstance(pos, torch.Tensor):
            kv.index_copy_(3, pos.view(1), new)
        else:
            kv[:, :, :, pos:pos + t] = new
        q = proj[:, :, 0].transpose(1, 2)  # (R, H, T, Dh)
        out = attend(q, kv[:, 0], kv[:, 1], mask, self._sdpa(x))
        return self.out_proj(out.transpose(1, 2).reshape(r, t, d))

    def step_cross(self, x: torch.Tensor, kv: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """Cross-attention of x (R, T, D) to kv (A, 2, H, S, Dh), one set per sentence
        (`memory_kv`), src_mask (A, 1, 1, S): a sentence's W = R / A rows are its W * T
        queries. Returns (R, T, D)."""
        r, t, d = x.shape
        a = kv.size(0)
        q = self._heads(self.q_proj(x.reshape(a, r // a * t, d)))  # (A, H, W*T, Dh)
        out = attend(q, kv[:, 0], kv[:, 1], src_mask, self._sdpa(x))  # (A, H, W*T, Dh)
        return self.out_proj(out.transpose(1, 2).reshape(r, t, d))

    def _sdpa(self, x: torch.Tensor) -> bool:
        """Whether x's attention takes SDPA: `use_sdpa`, or by device; always when compiled
        (the explicit path's check for empty rows reads a value, which would break the graph
        in every attention layer)."""
        use = x.device.type != "cpu" if self.use_sdpa is None else self.use_sdpa
        return use or torch.compiler.is_compiling()


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
           use_sdpa: bool) -> torch.Tensor:
    """softmax(q k^T / sqrt(Dh)) v, (B, H, Q, Dh), for decoding; mask None or bool (.., Q, K),
    True = may attend. Every query here has a key (BOS, or a real source token)."""
    if use_sdpa:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    scores = q @ k.transpose(-2, -1) / q.size(-1) ** 0.5  # (B, H, Q, K)
    if mask is not None:
        scores = scores.masked_fill_(~mask, torch.finfo(scores.dtype).min)
    return scores.softmax(dim=-1) @ v


def set_attention_path(model: nn.Module, use_sdpa: bool | None) -> None:
    """Set the attention path of every `MultiHeadAttention` in `model`: True SDPA, False the
    explicit product, None the default (SDPA on CUDA, explicit on CPU)."""
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.use_sdpa = use_sdpa
