"""The encoder-decoder Transformer of Vaswani et al. (2017).

Shapes: B batch, S source length, T target length, D d_model, V vocabulary.

API in the shape of the paper, plain tensors in and out:
    memory = model.encode(src_ids)                                 # (B, S, D)
    logits = model.decode(tgt_in_ids, memory, src_ids, cache=None)  # (B, T, V)
    logits = model(src_ids, tgt_in_ids)                             # (B, T, V)
    logits = model(src_ids, tgt_in_ids, predict_index=index)        # (N, V), training
Masks are never passed in: they are built here from the ids and `pad_id` (masks.py).
"""

from __future__ import annotations

import torch
from torch import nn

from transformer.config import ModelConfig
from transformer.model.attention import autocast_input, key_bias
from transformer.model.cache import DecoderCache, cached_states
from transformer.model.dropout import Dropout
from transformer.model.layers import DecoderLayer, EncoderLayer, sinusoid_table
from transformer.model.masks import src_key_mask, tgt_self_mask


class Transformer(nn.Module):
    """The encoder-decoder of Vaswani et al. (2017), configured by a ModelConfig.

    Token embeddings (shared by source, target and output projection when
    `tie_embeddings`) scaled by sqrt(d_model) plus the sinusoidal table `sinusoids`,
    `n_encoder_layers` EncoderLayers and `n_decoder_layers` DecoderLayers, post-norm as in
    the paper or pre-norm (then with a final LayerNorm per stack), and a bias-free output
    projection. Masks are built from the ids inside `encode`/`decode`; see the module
    docstring for the API.

    Args:
        cfg: the sizes (vocab_size, d_model, n_heads, d_ff, layers, max_positions),
            dropouts, pre- or post-norm, embedding tying and the special ids (pad_id,
            bos_id, eos_id). The weights start Xavier-uniform (`reset_parameters`);
            `checkpoint.load_model` builds the model of a checkpoint and loads its weights.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, v = cfg.d_model, cfg.vocab_size
        layer_args = (d, cfg.n_heads, cfg.d_ff, cfg.dropout, cfg.attn_dropout, cfg.ffn_dropout,
                      cfg.pre_norm)
        self.src_embed = nn.Embedding(v, d, padding_idx=cfg.pad_id)
        self.tgt_embed = nn.Embedding(v, d, padding_idx=cfg.pad_id)
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(*layer_args) for _ in range(cfg.n_encoder_layers)
        )
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(*layer_args) for _ in range(cfg.n_decoder_layers)
        )
        # Pre-norm stacks end un-normalised, so they get a final LayerNorm.
        self.encoder_norm = nn.LayerNorm(d) if cfg.pre_norm else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d) if cfg.pre_norm else nn.Identity()
        self.out_proj = nn.Linear(d, v, bias=False)
        self.dropout = Dropout(cfg.dropout)
        self.register_buffer("sinusoids", sinusoid_table(cfg.max_positions, d), persistent=False)
        self.embed_scale = d**0.5
        self.reset_parameters()
        if cfg.tie_embeddings:  # section 3.4: one matrix for both embeddings and the output
            self.tgt_embed.weight = self.src_embed.weight
            self.out_proj.weight = self.src_embed.weight

    def reset_parameters(self) -> None:
        """Xavier-uniform for every matrix, zero biases, a zero padding embedding."""
        for name, p in self.named_parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        with torch.no_grad():
            self.src_embed.weight[self.cfg.pad_id].zero_()
            self.tgt_embed.weight[self.cfg.pad_id].zero_()

    def _check_ids(self, ids: torch.Tensor, name: str) -> None:
        """The ids' shape and dtype (metadata, never a read of the values). Their range is
        checked where it costs no wait: on a CPU tensor, the embedding lookup checks every
        id (an IndexError, turned into a ValueError naming the tensor by `_embed`). On a
        GPU the values are not read back (a read per forward would stop the host every
        update): the data path checks them on the host (`collate(vocab_size=...)`, the
        tokenizer's ids are below its size), and an id out of range there is CUDA's
        device-side assert."""
        if ids.dim() != 2 or ids.dtype not in (torch.long, torch.int32):
            raise ValueError(f"{name} must be a (batch, length) integer tensor, got "
                             f"shape {tuple(ids.shape)} and dtype {ids.dtype}")

    def _embed(self, embed: nn.Embedding, ids: torch.Tensor, name: str, offset: int = 0) -> torch.Tensor:
        """Token embeddings scaled by sqrt(D) plus sinusoidal positions (section 3.4-3.5)."""
        end = offset + ids.size(1)
        if end > self.cfg.max_positions:
            raise ValueError(f"sequence of {end} tokens exceeds model max_positions={self.cfg.max_positions}")
        try:
            x = embed(ids)
        except IndexError:  # the CPU lookup's range check: say which tensor and which ids
            raise ValueError(f"{name} holds ids outside the vocabulary [0, {self.cfg.vocab_size}): "
                             f"min {int(ids.min())}, max {int(ids.max())}") from None
        x = x * self.embed_scale + self.sinusoids[offset:end]
        return self.dropout(x)

    def encode(self, src_ids: torch.Tensor) -> torch.Tensor:
        """src_ids (B, S) -> memory (B, S, D).

        Args:
            src_ids: source token ids (B, S), right-padded with `pad_id`; no BOS or EOS
                (what `batching.collate` builds). At most max_positions long.

        Returns:
            The encoder's output (B, S, D), for `decode`; rows at padded positions are
            computed too and ignored by `decode`'s cross-attention.

        Raises:
            ValueError: ids that are not a (B, S) integer tensor, lie outside the
                vocabulary, or exceed max_positions.
        """
        self._check_ids(src_ids, "src_ids")
        x = self._embed(self.src_embed, src_ids, "src_ids")
        src_mask = src_key_mask(src_ids, self.cfg.pad_id)  # (B, 1, 1, S)
        src_bias = key_bias(src_mask, _compute_dtype(x))  # once for every layer
        for layer in self.encoder_layers:
            x = layer(x, src_mask, src_bias)
        return self.encoder_norm(x)

    def decode(
        self,
        tgt_in_ids: torch.Tensor,
        memory: torch.Tensor,
        src_ids: torch.Tensor,
        cache: DecoderCache | None = None,
    ) -> torch.Tensor:
        """tgt_in_ids (B, T), memory (B, S, D), src_ids (B, S) -> logits (B, T, V).

        With a cache, tgt_in_ids are only the new positions; the cache is updated.

        Args:
            tgt_in_ids: target input ids (B, T): BOS then the target tokens, right-padded;
                with a cache, only the positions not fed yet (one per step in search).
            memory: `encode(src_ids)` (B, S, D).
            src_ids: the source ids (B, S) the memory came from: their padding is
                masked in cross-attention.
            cache: None: decode all T positions at once. A `DecoderCache` (empty at the
                first call): earlier positions are read from it and the new ones added.

        Returns:
            Logits (B, T, V) over the vocabulary for the next token at each position
            (not normalised: `log_softmax` them for log-probabilities).

        Raises:
            ValueError: ids outside the vocabulary, shapes that disagree, or a target
                longer than max_positions.
        """
        return self.out_proj(self._decoder_states(tgt_in_ids, memory, src_ids, cache))

    def forward(
        self, src_ids: torch.Tensor, tgt_in_ids: torch.Tensor, predict_mask: torch.Tensor | None = None,
        predict_index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """src_ids (B, S), tgt_in_ids (B, T) -> logits (B, T, V) (teacher forcing).

        predict_mask / predict_index: optional; then logits are computed only at the
        positions they name and returned as (N, V), in row-major order. Training passes the
        non-padding targets: the output layer is the largest matrix of a small model, and
        its work at padded positions would be thrown away by the loss. `predict_index`
        (what training passes, `Batch.predict_index`) never reads the device; a
        `predict_mask` is indexing with a bool mask, whose output size the host must read.

        Args:
            src_ids: source ids (B, S), right-padded, no BOS or EOS.
            tgt_in_ids: target input ids (B, T): BOS then the target, right-padded (the
                target shifted right; `tgt_out_ids` is the target then EOS).
            predict_mask: None, or a bool (B, T) that is True where logits are wanted.
            predict_index: None, or the (N,) long flat positions (row * T + column) where
                logits are wanted, ascending.

        Returns:
            Logits (B, T, V) at every target position, or (N, V) at the N positions named.

        Raises:
            ValueError: ids outside the vocabulary or too long, shapes that disagree, or a
                `predict_mask` that is not a bool tensor of tgt_in_ids' shape.
        """
        states = self._decoder_states(tgt_in_ids, self.encode(src_ids), src_ids)  # (B, T, D)
        if predict_mask is not None:
            if predict_mask.shape != tgt_in_ids.shape or predict_mask.dtype != torch.bool:
                raise ValueError(f"predict_mask must be a bool tensor of shape {tuple(tgt_in_ids.shape)}, "
                                 f"got {predict_mask.dtype} {tuple(predict_mask.shape)}")
            states = states[predict_mask]  # (N, D)
        elif predict_index is not None:
            states = states.flatten(0, 1).index_select(0, predict_index)  # (N, D)
        return self.out_proj(states)

    def _decoder_states(
        self,
        tgt_in_ids: torch.Tensor,
        memory: torch.Tensor,
        src_ids: torch.Tensor,
        cache: DecoderCache | None = None,
    ) -> torch.Tensor:
        """The decoder's output before the vocabulary projection, (B, T, D)."""
        self._check_ids(tgt_in_ids, "tgt_in_ids")
        if cache is not None:  # one step of incremental decoding (cache.py)
            try:
                return cached_states(self, tgt_in_ids, memory, src_ids, cache)
            except IndexError:  # the CPU lookup's range check: name the tensor
                raise ValueError(f"tgt_in_ids holds ids outside the vocabulary [0, {self.cfg.vocab_size})") from None
        if memory.shape[:2] != src_ids.shape or tgt_in_ids.size(0) != src_ids.size(0):
            raise ValueError(f"shapes disagree: tgt_in_ids {tuple(tgt_in_ids.shape)}, memory "
                             f"{tuple(memory.shape)}, src_ids {tuple(src_ids.shape)}")
        tgt_mask = tgt_self_mask(tgt_in_ids, self.cfg.pad_id)  # (B, 1, T, T)
        src_mask = src_key_mask(src_ids, self.cfg.pad_id)  # (B, 1, 1, S)
        memory = autocast_input(memory)  # once, not in every layer's k and v projections
        x = self._embed(self.tgt_embed, tgt_in_ids, "tgt_in_ids")
        src_bias = key_bias(src_mask, _compute_dtype(x))  # the source's key padding, for SDPA
        for layer in self.decoder_layers:
            x = layer(x, memory, tgt_mask, src_mask, src_bias)
        return self.decoder_norm(x)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype attention scores take: autocast's where it is on, else x's."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


def build_model(cfg: ModelConfig) -> Transformer:
    return Transformer(cfg)


def count_parameters(model: nn.Module) -> int:
    """Distinct trainable parameters (tied matrices counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
