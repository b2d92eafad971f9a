"""Attention masks built from batched token ids.

Convention, everywhere in this package: a mask is a bool tensor, True = "may attend".
Every mask has a fixed 4-D shape that broadcasts against attention scores (B, H, T, S),
and is turned into scores in exactly one place (`attention.py`).

Shapes: B batch, S source length, T target length, H heads (always 1 here, broadcast).

Which mask goes where (Vaswani et al. 2017, section 3.2.3):

- encoder self-attention: `src_key_mask` - every query may read every real source token.
- decoder self-attention: `tgt_self_mask` - causal AND target key padding.
- decoder cross-attention: `src_key_mask` again - every target position may read the
  whole real source; there is no causal part, because the source is known in full
  before decoding starts.
"""

from __future__ import annotations

import torch


def real_key_mask(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """(B, L) ids -> (B, 1, 1, L) bool: True where the key is a real token.

    The opposite of PyTorch's `key_padding_mask` (nn.MultiheadAttention, nn.Transformer),
    whose True means "padding, ignore": hence another name.
    """
    return (ids != pad_id)[:, None, None, :]


def src_key_mask(src_ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Mask for encoder self-attention and for cross-attention: (B, 1, 1, S)."""
    return real_key_mask(src_ids, pad_id)


def causal_mask(t: int, device: torch.device | None = None, n_queries: int | None = None) -> torch.Tensor:
    """(1, 1, Q, T) bool: the query at position p may attend to keys 0..p.

    The Q = n_queries (default T) queries are the last positions T-Q..T-1, as when
    incremental decoding feeds new tokens after T-Q cached ones.
    """
    n_queries = t if n_queries is None else n_queries
    q_pos = torch.arange(t - n_queries, t, device=device)[:, None]  # (Q, 1)
    k_pos = torch.arange(t, device=device)[None, :]  # (1, T)
    return (k_pos <= q_pos)[None, None]


def tgt_self_mask(tgt_ids: torch.Tensor, pad_id: int, n_queries: int | None = None) -> torch.Tensor:
    """Mask for decoder self-attention: causal AND target key padding, (B, 1, Q, T).

    tgt_ids (B, T) are all target ids so far; the rows are those of the last `n_queries`
    positions (default all T), the new ones in incremental decoding.
    """
    t = tgt_ids.size(1)
    return causal_mask(t, tgt_ids.device, n_queries) & real_key_mask(tgt_ids, pad_id)
