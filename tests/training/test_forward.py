"""transformer/training/forward.py: the forward on the low-precision copies gives
autocast's logits and gradients bit for bit, the modules get their fp32 parameters back,
the tied embedding and LayerNorms are left to autocast; compiled by default on CUDA only,
and the low-precision copies only for an eager bf16/fp16 run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from transformer import checkpoint as ckpt
from transformer.config import ModelConfig
from transformer.data.batching import Batch, collate
from transformer.model.transformer import Transformer
from transformer.training.forward import LowPrecisionWeights, TrainForward
from transformer.training.loss import batch_loss

from helpers import run

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


def batch_of(rows: int, src_len: int, tgt_len: int, seed: int) -> Batch:
    """A padded batch of `rows` pairs of random ids whose longest source is `src_len` and
    longest target `tgt_len` tokens (BOS or EOS included), the others shorter."""
    gen = torch.Generator().manual_seed(seed)

    def ids(longest: int, row: int) -> list[int]:
        n = longest if row == 0 else int(torch.randint(1, longest + 1, (), generator=gen))
        return torch.randint(4, 32, (n,), generator=gen).tolist()

    batch = collate([{"src_ids": ids(src_len, r), "tgt_ids": ids(tgt_len - 1, r)} for r in range(rows)],
                    pad_id=0, bos_id=2, eos_id=3)
    assert (*batch.src_ids.shape, batch.tgt_in_ids.size(1)) == (rows, src_len, tgt_len)
    return batch


@pytest.fixture
def aot_eager(monkeypatch):
    """torch.compile with dynamo's `aot_eager` backend (dynamo's and AOT autograd's graphs,
    no code generation), its counters from zero."""
    from torch._dynamo.utils import counters

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, backend="aot_eager", **kw))
    torch._dynamo.reset()
    counters.clear()
    return counters


def test_one_graph_serves_every_batch_shape_and_a_single_sentence_adds_one(aot_eager):
    """The compiled forward and loss, with backward, over batches whose rows (B), source (S)
    and target (T) lengths vary one at a time and together: the first batch has B = S = T
    (dynamo would give them one symbol), then S alone changes, T alone, B alone (each a
    recompile when only the sizes seen to vary become dynamic). One graph serves them all;
    a batch of one sentence (B = 1, which dynamo specialises) adds one graph, once; no graph
    breaks. Each loss and gradient equals the eager forward's."""
    shapes = [(6, 6, 6), (6, 9, 6), (6, 9, 11), (10, 9, 11), (3, 12, 4), (7, 7, 7), (1, 8, 5), (12, 3, 9),
              (1, 13, 10), (5, 2, 2), (16, 5, 8)]
    compiled_model, eager_model = tiny(), tiny()
    forward = TrainForward(compiled_model, compiled_model, "fp32", torch.device("cpu"), True)
    graphs = []
    for i, (rows, src_len, tgt_len) in enumerate(shapes):
        batch = batch_of(rows, src_len, tgt_len, seed=i)
        losses = []
        for model, loss_fn in ((compiled_model, lambda b: forward(b, 0.1, first=True)),
                               (eager_model, lambda b: batch_loss(eager_model, b, 0.1, "fp32", torch.device("cpu")))):
            model.zero_grad(set_to_none=True)
            loss, nll = loss_fn(batch)
            loss.backward()
            losses.append((loss.detach(), nll))
        torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-5)
        for (name, p), q in zip(compiled_model.named_parameters(), eager_model.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)
        graphs.append(aot_eager["stats"]["unique_graphs"])
    assert graphs == [1] * 6 + [2] * 5, graphs
    assert sum(aot_eager["graph_break"].values()) == 0, dict(aot_eager["graph_break"])
    assert forward.compiled and forward.compile_seconds is not None


def test_a_failing_compile_is_one_line_and_training_goes_on_eagerly(tmp_path, monkeypatch):
    """A backend that fails (as inductor does without a C++ compiler or Triton): the run logs
    one line naming the error and trains on eagerly, bf16 on the Linear layers' copies, to
    its last update and checkpoint."""
    def broken(gm, example_inputs):
        raise RuntimeError("no working C++ compiler found (injected)\nmore detail")

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, backend=broken, **kw))
    torch._dynamo.reset()
    trainer = run(tmp_path / "run", "trainer.max_steps=4", "trainer.compile=true", "trainer.precision=bf16")
    assert trainer.state.step == 4 and not trainer.forward.compiled and trainer.forward.low is not None
    assert [p.name for p in ckpt.step_checkpoints(tmp_path / "run")] == ["step_4"]
    logged = (tmp_path / "run" / "train.log").read_text()
    failed = [line for line in logged.splitlines() if "compiling the training step failed" in line]
    assert len(failed) == 1 and failed[0].endswith(
        "WARNING transformer.training.forward: compiling the training step failed (RuntimeError: no working "
        "C++ compiler found (injected)); training goes on eagerly"), logged
    assert "compiled the training step in" not in logged
