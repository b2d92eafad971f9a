"""Building blocks of the Transformer: positions, feed-forward, encoder and decoder layers.

Shapes: B batch, S source length, T target length, D d_model.

Residual blocks are post-norm as in the paper, LayerNorm(x + Dropout(Sublayer(x)))
(section 5.4), or pre-norm, x + Dropout(Sublayer(LayerNorm(x))), which trains more
stably in deep or large-learning-rate settings (Xiong et al. 2020).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from transformer.model.attention import MultiHeadAttention
from transformer.model.dropout import Dropout


def sinusoid_table(max_len: int, d_model: int) -> torch.Tensor:
    """(max_len, D) sinusoidal positions of section 3.5: sin on even, cos on odd dims."""
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(1e4) / d_model))
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(pos * inv_freq)
    table[:, 1::2] = torch.cos(pos * inv_freq)
    return table


class FeedForward(nn.Module):
    """Position-wise FFN(x) = max(0, x W1 + b1) W2 + b2 (section 3.3)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))

    def step(self, x: torch.Tensor) -> torch.Tensor:
        """The FFN on a decoding step's x (R, T, D): in eval mode its first product and ReLU
        are one fused op (`torch._addmm_activation`, what nn.TransformerEncoderLayer's fast
        path runs)."""
        if self.training:
            return self(x)
        r, t, d = x.shape
        hidden = torch._addmm_activation(self.linear1.bias, x.reshape(r * t, d), self.linear1.weight.t())
        return self.linear2(hidden).view(r, t, d)


class Residual(nn.Module):
    """One sublayer with its residual connection, dropout and LayerNorm."""

    def __init__(self, d_model: int, dropout: float, pre_norm: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.pre_norm = pre_norm

    def forward(self, x: torch.Tensor, sublayer) -> torch.Tensor:
        if self.pre_norm:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))

    def step(self, x: torch.Tensor, sublayer) -> torch.Tensor:
        """`forward` for a decoding step: in eval mode the sum is written into the
        sublayer's new output (no tensor allocated for it)."""
        if self.training:
            return self(x, sublayer)
        if self.pre_norm:
            return sublayer(self.norm(x)).add_(x)
        return self.norm(sublayer(x).add_(x))


class EncoderLayer(nn.Module):
    """Self-attention over the source, then the FFN; each a Residual (section 3.1).

    Its mask closes the source's pad keys (`masks.src_key_mask`).
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float,
                 attn_dropout: float, ffn_dropout: float, pre_norm: bool) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, attn_dropout)
        self.ffn = FeedForward(d_model, d_ff, ffn_dropout)
        self.self_attn_res = Residual(d_model, dropout, pre_norm)
        self.ffn_res = Residual(d_model, dropout, pre_norm)

    def forward(self, x: torch.Tensor, src_mask: torch.Tensor, src_bias: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, S, D), src_mask (B, 1, 1, S), src_bias its `attention.key_bias` -> (B, S, D)."""
        x = self.self_attn_res(x, lambda h: self.self_attn(h, h, src_mask, bias=src_bias))
        return self.ffn_res(x, self.ffn)


class DecoderLayer(nn.Module):
    """Causal self-attention over the target, cross-attention to the encoder's memory, then
    the FFN; each a Residual (section 3.1). `forward` runs a whole target (training,
    teacher forcing); `step` the new positions of incremental decoding on a
    `cache.DecoderCache`."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float,
                 attn_dropout: float, ffn_dropout: float, pre_norm: bool) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, attn_dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, attn_dropout)
        self.ffn = FeedForward(d_model, d_ff, ffn_dropout)
        self.self_attn_res = Residual(d_model, dropout, pre_norm)
        self.cross_attn_res = Residual(d_model, dropout, pre_norm)
        self.ffn_res = Residual(d_model, dropout, pre_norm)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        tgt_mask: torch.Tensor,
        src_mask: torch.Tensor,
        src_bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x (B, T, D) a whole right-padded target, memory (B, S, D), tgt_mask (B, 1, T, T),
        src_mask (B, 1, 1, S), src_bias its `key_bias` (what SDPA reads instead)."""
        x = self.self_attn_res(x, lambda h: self.self_attn(h, h, tgt_mask, causal=True))
        x = self.cross_attn_res(x, lambda h: self.cross_attn(h, memory, src_mask, bias=src_bias))
        return self.ffn_res(x, self.ffn)

    def step(
        self,
        x: torch.Tensor,
        kv: torch.Tensor,
        cross: torch.Tensor,
        src_mask: torch.Tensor,
        pos: int | torch.Tensor,
        mask: torch.Tensor,
        qkv: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """x (R, T, D) at positions pos.. (an int, or a 0-d tensor: `MultiHeadAttention.step`);
        kv (R, 2, H, L, Dh) this layer's self-attention cache, written at those positions,
        read under `mask` (1, 1, T, L); cross (A, 2, H, S, Dh) its keys and values of the
        memory, src_mask (A, 1, 1, S); qkv the self-attention's fused projection.
        Returns (R, T, D)."""
        x = self.self_attn_res.step(x, lambda h: self.self_attn.step(h, kv, pos, mask, qkv))
        x = self.cross_attn_res.step(x, lambda h: self.cross_attn.step_cross(h, cross, src_mask))
        return self.ffn_res.step(x, self.ffn.step)
