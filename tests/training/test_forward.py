"""transformer/training/forward.py: the forward on the low-precision copies gives
autocast's logits and gradients bit for bit, the modules get their fp32 parameters back,
the tied embedding and LayerNorms are left to autocast; compiled by default on CUDA only,
and the low-precision copies only for an eager bf16/fp16 run."""

from __future__ import annotations

import torch
from torch import nn

from transformer.config import ModelConfig
from transformer.model.transformer import Transformer
from transformer.training.forward import LowPrecisionWeights, TrainForward

SRC = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])
TGT_IN = torch.tensor([[1, 11, 12], [1, 13, 0]])


def tiny() -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=32, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=2, n_decoder_layers=1,
                      dropout=0.0, attn_dropout=0.0, ffn_dropout=0.0, max_positions=16, pre_norm=True)
    return Transformer(cfg).train()


def backward(model: Transformer, low: LowPrecisionWeights | None, micro: int = 1):
    """Logits of the last micro-batch and the fp32 gradients after `micro` backward passes."""
    model.zero_grad(set_to_none=True)
    for i in range(micro):
        if low is not None and i == 0:
            low.refresh()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if low is None:
                logits = model(SRC, TGT_IN)
            else:
                with low.swapped():
                    logits = model(SRC, TGT_IN)
        logits.float().square().mean().backward()
        if low is not None:
            low.collect(first=i == 0)
    return logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def test_logits_and_gradients_equal_autocasts():
    model = tiny()
    plain_logits, plain_grads = backward(model, None)
    low = LowPrecisionWeights(model, torch.bfloat16)
    low_logits, low_grads = backward(model, low)
    assert torch.equal(low_logits, plain_logits)
    for name, grad in plain_grads.items():
        assert low_grads[name].dtype == torch.float32
        torch.testing.assert_close(low_grads[name], grad, rtol=0, atol=0, msg=name)


def test_accumulated_micro_batches_add_in_fp32():
    model = tiny()
    _, plain = backward(model, None, micro=3)
    _, low = backward(model, LowPrecisionWeights(model, torch.bfloat16), micro=3)
    for name, grad in plain.items():
        torch.testing.assert_close(low[name], grad, rtol=0, atol=0, msg=name)


def test_a_weight_no_micro_batch_used_keeps_no_gradient_as_under_autocast():
    """Adam steps a parameter whose .grad is a tensor, zeros too: an unused Linear keeps
    None, as autocast's backward leaves it; one used by a later micro-batch gets its sum."""
    model = tiny()
    spare = nn.Linear(16, 16)
    model.spare = spare  # a Linear the forward never calls
    low = LowPrecisionWeights(model, torch.bfloat16)
    model.zero_grad(set_to_none=True)
    for i in range(2):
        if i == 0:
            low.refresh()
        with torch.autocast("cpu", dtype=torch.bfloat16), low.swapped():
            logits = model(SRC, TGT_IN)
            if i == 1:  # the second micro-batch uses it
                logits = logits + spare(torch.ones(1, 16)).sum()
        logits.float().square().mean().backward()
        low.collect(first=i == 0)
        if i == 0:
            assert spare.weight.grad is None and spare.bias.grad is None
            assert model.encoder_layers[0].ffn.linear1.weight.grad is not None
    assert spare.weight.grad is not None and spare.weight.grad.abs().sum() > 0


def test_the_modules_hold_their_fp32_parameters_outside_the_forward():
    model = tiny()
    before = dict(model.named_parameters())
    low = LowPrecisionWeights(model, torch.bfloat16)
    low.refresh()
    with low.swapped():
        assert model.encoder_layers[0].ffn.linear1.weight.dtype == torch.bfloat16
    assert dict(model.named_parameters()) == before
    assert all(p.dtype == torch.float32 for p in model.state_dict().values() if p.is_floating_point())


def test_only_parameters_of_linear_layers_get_copies():
    model = tiny()
    low = LowPrecisionWeights(model, torch.bfloat16)
    copied = {id(p) for p in low.params}
    assert id(model.src_embed.weight) not in copied  # tied: the embedding lookups read it
    for module in model.modules():
        if isinstance(module, nn.LayerNorm):
            assert id(module.weight) not in copied
    assert id(model.encoder_layers[0].self_attn.q_proj.weight) in copied
    linears = [p for m in model.modules() if isinstance(m, nn.Linear) for p in m.parameters(recurse=False)]
    assert len(copied) == len({id(p) for p in linears}) - 1  # every Linear's but the tied output


def test_compiled_by_default_on_cuda_only_and_copies_only_for_eager_mixed_precision(monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)  # what is compiled, not how
    model = tiny()
    assert not TrainForward(model, model, "bf16", torch.device("cpu"), None).compiled
    assert TrainForward(model, model, "bf16", torch.device("cuda"), None).compiled
    assert not TrainForward(model, model, "bf16", torch.device("cuda"), False).compiled
    assert TrainForward(model, model, "bf16", torch.device("cpu"), None).low is not None
    assert TrainForward(model, model, "fp32", torch.device("cpu"), None).low is None
    assert TrainForward(model, model, "bf16", torch.device("cpu"), True).low is None
