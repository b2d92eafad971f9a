"""Agreement with an independent implementation: PyTorch's nn.TransformerEncoder/Decoder
loaded with our weights give the same outputs on a padded batch.

PyTorch's mask convention is the opposite of ours (their bool masks say True = ignore),
so the reference gets explicit float masks: 0 = may attend, -inf = masked.
Shapes: B batch, S source len, T target len, D d_model.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from transformer.config import ModelConfig
from transformer.model.attention import set_attention_path
from transformer.model.transformer import Transformer

PAD, BOS, EOS, V = 0, 2, 3, 24
D, H, D_FF, LAYERS = 32, 4, 64, 2

SRC = torch.tensor([[5, 6, 7, 8, 9, EOS], [10, 11, EOS, PAD, PAD, PAD], [12, EOS, PAD, PAD, PAD, PAD]])
TGT = torch.tensor([[BOS, 5, 6, 7, PAD], [BOS, 10, 11, 12, 13], [BOS, 14, PAD, PAD, PAD]])


def ours(pre_norm: bool) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=V, d_model=D, n_heads=H, d_ff=D_FF, n_encoder_layers=LAYERS,
                      n_decoder_layers=LAYERS, dropout=0.0, attn_dropout=0.0, max_positions=16,
                      pre_norm=pre_norm, pad_id=PAD)
    model = Transformer(cfg).eval()
    with torch.no_grad():  # non-trivial biases and norms, so a swapped one would show
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def copy_attention(dst: nn.MultiheadAttention, src) -> None:
    dst.in_proj_weight.copy_(torch.cat([src.q_proj.weight, src.k_proj.weight, src.v_proj.weight]))
    dst.in_proj_bias.copy_(torch.cat([src.q_proj.bias, src.k_proj.bias, src.v_proj.bias]))
    dst.out_proj.load_state_dict(src.out_proj.state_dict())


def reference(model: Transformer) -> tuple[nn.TransformerEncoder, nn.TransformerDecoder]:
    """PyTorch stacks holding our weights; final LayerNorms only for pre-norm, as ours."""
    pre_norm = model.cfg.pre_norm
    kwargs = dict(d_model=D, nhead=H, dim_feedforward=D_FF, dropout=0.0, activation="relu",
                  batch_first=True, norm_first=pre_norm)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(**kwargs), LAYERS,
                                norm=nn.LayerNorm(D) if pre_norm else None,
                                enable_nested_tensor=False)
    dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(**kwargs), LAYERS,
                                norm=nn.LayerNorm(D) if pre_norm else None)
    with torch.no_grad():
        for theirs, mine in zip(enc.layers, model.encoder_layers):
            copy_attention(theirs.self_attn, mine.self_attn)
            theirs.linear1.load_state_dict(mine.ffn.linear1.state_dict())
            theirs.linear2.load_state_dict(mine.ffn.linear2.state_dict())
            theirs.norm1.load_state_dict(mine.self_attn_res.norm.state_dict())
            theirs.norm2.load_state_dict(mine.ffn_res.norm.state_dict())
        for theirs, mine in zip(dec.layers, model.decoder_layers):
            copy_attention(theirs.self_attn, mine.self_attn)
            copy_attention(theirs.multihead_attn, mine.cross_attn)
            theirs.linear1.load_state_dict(mine.ffn.linear1.state_dict())
            theirs.linear2.load_state_dict(mine.ffn.linear2.state_dict())
            theirs.norm1.load_state_dict(mine.self_attn_res.norm.state_dict())
            theirs.norm2.load_state_dict(mine.cross_attn_res.norm.state_dict())
            theirs.norm3.load_state_dict(mine.ffn_res.norm.state_dict())
        if pre_norm:
            enc.norm.load_state_dict(model.encoder_norm.state_dict())
            dec.norm.load_state_dict(model.decoder_norm.state_dict())
    return enc.eval(), dec.eval()


def additive(keep: torch.Tensor) -> torch.Tensor:
    """Bool, True = may attend -> float, 0 or -inf (PyTorch adds float masks to scores)."""
    return torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))


@pytest.mark.parametrize("use_sdpa", [False, True], ids=["explicit", "sdpa"])
@pytest.mark.parametrize("pre_norm", [False, True], ids=["post-norm", "pre-norm"])
def test_same_outputs_as_torch_nn_transformer_on_a_padded_batch(pre_norm, use_sdpa):
    """Both attention paths: the explicit product (CPU's) and SDPA (CUDA's), run on CPU."""
    model = ours(pre_norm)
    set_attention_path(model, use_sdpa)
    enc, dec = reference(model)
    s, t = SRC.size(1), TGT.size(1)
    # Same input for both: embeddings * sqrt(D) + sinusoidal positions (no dropout).
    src_x = model.src_embed(SRC) * D**0.5 + model.sinusoids[:s]
    tgt_x = model.tgt_embed(TGT) * D**0.5 + model.sinusoids[:t]
    src_pad = additive(SRC != PAD)  # (B, S)
    tgt_pad = additive(TGT != PAD)  # (B, T)
    causal = additive(torch.ones(t, t, dtype=torch.bool).tril())  # (T, T)
    with torch.no_grad():
        memory = model.encode(SRC)
        logits = model.decode(TGT, memory, SRC)
        ref_memory = enc(src_x, src_key_padding_mask=src_pad)
        ref_hidden = dec(tgt_x, ref_memory, tgt_mask=causal, tgt_key_padding_mask=tgt_pad,
                         memory_key_padding_mask=src_pad)
        ref_logits = model.out_proj(ref_hidden)
    real_src, real_tgt = SRC != PAD, TGT != PAD
    assert (memory[real_src] - ref_memory[real_src]).abs().max() <= 1e-5
    assert (logits[real_tgt] - ref_logits[real_tgt]).abs().max() <= 1e-5
