"""The CUDA path (`pytest -m gpu`; skipped without CUDA): the model, its masks, training
steps in bf16 and fp16, search and checkpoints on a GPU agree with the CPU.

scripts/gpu_check.sh runs these first whenever a GPU is at hand (docs/gpu.md,
"Checking a GPU"). fp32 comparisons switch TF32 off: with it a GPU matmul rounds its
inputs to 10 mantissa bits, and CPU and GPU would differ by far more than their order of
summation. The CPU side runs the explicit attention path, the GPU side
`scaled_dot_product_attention`'s fused kernels: agreement checks both.

Shapes: B batch, S source len, T target len, V vocab.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from transformer import checkpoint as ckpt
from transformer.config import DecodeConfig, ModelConfig, OptimConfig
from transformer.data.batching import collate
from transformer.decoding.search import search
from transformer.device import resolve_precision
from transformer.model.masks import src_key_mask, tgt_self_mask
from transformer.model.transformer import DecoderCache, Transformer, build_model
from transformer.training.loss import batch_loss
from transformer.training.optimizer import build_optimizer

from helpers import run, tiny_checkpoint

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
PAD, BOS, EOS, V = 0, 2, 3, 40


@pytest.fixture(autouse=True)
def _no_tf32():
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def model_pair(pre_norm: bool = False, seed: int = 0, d_model: int = 64) -> tuple[Transformer, Transformer]:
    """The same random model on the CPU and on the GPU, in eval mode."""
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=V, d_model=d_model, n_heads=4, d_ff=2 * d_model, n_encoder_layers=2,
                      n_decoder_layers=2, dropout=0.0, attn_dropout=0.0, ffn_dropout=0.0,
                      max_positions=64, pre_norm=pre_norm, pad_id=PAD, bos_id=BOS, eos_id=EOS)
    cpu = build_model(cfg).eval()
    gpu = build_model(cfg).to(CUDA).eval()
    gpu.load_state_dict(cpu.state_dict())
    return cpu, gpu


def padded(lengths: list[int], seed: int, first: int | None = None) -> torch.Tensor:
    """(B, L) rows of random ids of these lengths; each ends with EOS (first: BOS first)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        ids = torch.randint(4, V, (n,), generator=g).tolist()
        rows.append([first, *ids] if first is not None else [*ids, EOS])
    width = max(len(r) for r in rows)
    return torch.tensor([r + [PAD] * (width - len(r)) for r in rows])


SRC = padded([9, 3, 6, 1], seed=1)
TGT = padded([5, 8, 2, 6], seed=2, first=BOS)


# ---- the model and its masks ----------------------------------------------------------


def test_masks_built_on_cuda_equal_the_cpus():
    for ids in (SRC, TGT):
        assert torch.equal(src_key_mask(ids.to(CUDA), PAD).cpu(), src_key_mask(ids, PAD))
        assert torch.equal(tgt_self_mask(ids.to(CUDA), PAD).cpu(), tgt_self_mask(ids, PAD))


@pytest.mark.parametrize("pre_norm", [False, True], ids=["post-norm", "pre-norm"])
def test_forward_on_cuda_equals_cpu_in_fp32(pre_norm):
    cpu, gpu = model_pair(pre_norm)
    with torch.no_grad():
        want = cpu(SRC, TGT)
        got = gpu(SRC.to(CUDA), TGT.to(CUDA)).cpu()
    real = TGT != PAD
    torch.testing.assert_close(got[real], want[real], atol=1e-4, rtol=1e-4)


def test_appended_padding_changes_no_real_output_on_cuda():
    _, gpu = model_pair()
    src, tgt = SRC.to(CUDA), TGT.to(CUDA)
    with torch.no_grad():
        want = gpu(src, tgt)
        got = gpu(F.pad(src, (0, 7), value=PAD), F.pad(tgt, (0, 5), value=PAD))[:, : tgt.size(1)]
    real = tgt != PAD
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_an_all_padding_row_is_finite_and_padding_invariant_under_autocast(dtype):
    _, gpu = model_pair()
    src = torch.cat([SRC, torch.full((1, SRC.size(1)), PAD)]).to(CUDA)  # one all-padding source
    tgt = torch.cat([TGT, torch.full((1, TGT.size(1)), PAD)]).to(CUDA)
    with torch.no_grad(), torch.autocast("cuda", dtype=dtype):
        out = gpu(src, tgt).float()
        more = gpu(F.pad(src, (0, 6), value=PAD), tgt).float()
    assert torch.isfinite(out).all() and torch.isfinite(more).all()
    real = tgt != PAD
    torch.testing.assert_close(more[real], out[real], atol=5e-2, rtol=5e-2)


def test_cached_decoding_equals_full_decoding_on_cuda():
    _, gpu = model_pair(pre_norm=True)
    src, tgt = SRC.to(CUDA), TGT.to(CUDA)
    with torch.no_grad():
        memory = gpu.encode(src)
        full = gpu.decode(tgt, memory, src)
        cache = DecoderCache()
        steps = torch.cat([gpu.decode(tgt[:, t : t + 1], memory, src, cache) for t in range(tgt.size(1))], 1)
    real = tgt != PAD
    torch.testing.assert_close(steps[real], full[real], atol=1e-5, rtol=1e-5)


# ---- search -------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_search_on_cuda_finds_what_the_cpu_finds(method):
    cpu, gpu = model_pair(seed=3)
    with torch.no_grad():  # an EOS that wins about one step in ten, so that some hypotheses end early
        for m in (cpu, gpu):
            m.out_proj.weight[EOS] += 0.4 * m.out_proj.weight[4:].mean(0)
    cfg = DecodeConfig(method=method, beam_size=4, nbest=2 if method == "beam" else 1,
                       max_len_a=1.0, max_len_b=6, precision="fp32")
    want = search(cpu, SRC, cfg)
    got = search(gpu, SRC.to(CUDA), cfg)
    for g, w in zip(got, want, strict=True):
        assert [h.tokens for h in g] == [h.tokens for h in w]
        assert [h.score for h in g] == pytest.approx([h.score for h in w], abs=1e-3)


# ---- training steps -------------------------------------------------------------------


def gradients(model: Transformer, batch, precision: str) -> tuple[float, torch.Tensor]:
    """(loss, every gradient flattened) of one step on `batch` under `precision`."""
    model.zero_grad(set_to_none=True)
    loss, _ = batch_loss(model, batch, 0.1, precision, CUDA)
    (loss / batch.n_tgt_tokens).backward()
    return loss.item(), torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_mixed_precision_step_matches_fp32(precision):
    _, gpu = model_pair(d_model=128)
    gpu.train()
    batch = collate([{"src_ids": s[s != PAD][:-1].tolist(), "tgt_ids": t[t != PAD][1:].tolist()}
                     for s, t in zip(SRC, TGT, strict=True)], PAD, BOS, EOS).to(CUDA)
    loss32, grad32 = gradients(gpu, batch, "fp32")
    loss, grad = gradients(gpu, batch, precision)
    assert math.isfinite(loss) and torch.isfinite(grad).all()
    assert loss == pytest.approx(loss32, rel=1e-2)
    cosine = F.cosine_similarity(grad, grad32, dim=0).item()
    assert cosine > 0.999, f"{precision} gradients point elsewhere than fp32's (cosine {cosine:.5f})"
    assert (grad - grad32).norm() / grad32.norm() < 0.05


def test_fp16_step_with_an_inf_gradient_is_skipped_and_the_scale_lowered(tmp_path):
    trainer = run(tmp_path / "run", "trainer.max_steps=2", "trainer.precision=fp16", "trainer.device=cuda")
    batches = [next(trainer._micro_batches())[2]]
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    scale = trainer.scaler.get_scale()
    handle = trainer.model.src_embed.weight.register_hook(lambda g: g * float("inf"))
    assert trainer.train_step(batches)["applied"] == 0.0
    handle.remove()
    trainer.read_and_recount()  # the host learns of the skip when it reads the update metrics
    assert trainer.scaler.get_scale() < scale and trainer.state.skipped_steps == 1
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert trainer.train_step(batches)["applied"] == 1.0


def test_a_bf16_run_on_cuda_trains_with_finite_losses(tmp_path):
    trainer = run(tmp_path / "run", "trainer.max_steps=6", "trainer.precision=bf16", "trainer.device=cuda")
    assert trainer.state.step == 6 and trainer.state.skipped_steps == 0
    assert next(trainer.model.parameters()).device.type == "cuda"
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_the_fused_adamw_step_on_cuda_equals_the_cpus():
    """The trainer's optimizer (fused AdamW on both devices) given the same parameters and
    the same gradients moves them alike: the kernels differ, the arithmetic must not."""
    cpu, gpu = model_pair()
    cpu.train()
    opts = [build_optimizer(m, OptimConfig(lr=1e-3, weight_decay=0.01), d) for m, d in ((cpu, CPU), (gpu, CUDA))]
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        for p_cpu, p_gpu in zip(cpu.parameters(), gpu.parameters(), strict=True):
            p_cpu.grad = torch.randn(p_cpu.shape, generator=g)
            p_gpu.grad = p_cpu.grad.to(CUDA)
        for opt in opts:
            opt.step()
    for (name, a), b in zip(cpu.named_parameters(), gpu.parameters(), strict=True):
        torch.testing.assert_close(b.detach().cpu(), a.detach(), atol=1e-6, rtol=1e-5, msg=name)


def test_auto_precision_picks_bf16_on_a_gpu_that_has_it():
    precision, why = resolve_precision("auto", CUDA)
    assert precision == ("bf16" if torch.cuda.is_bf16_supported() else "fp16"), why


# ---- checkpoints across devices ---------------------------------------------------------


def test_a_run_saved_on_cuda_resumes_on_the_cpu_and_back(tmp_path):
    run_dir = tmp_path / "run"
    first = run(run_dir, "trainer.max_steps=4", "trainer.val_every=4", "trainer.device=cuda",
                "trainer.resume=auto", "trainer.precision=fp32")
    on_cpu = run(run_dir, "trainer.max_steps=8", "trainer.val_every=4", "trainer.device=cpu",
                 "trainer.resume=auto", "trainer.precision=fp32")
    assert on_cpu.state.step == 8 and next(on_cpu.model.parameters()).device.type == "cpu"
    saved_on_cuda, _ = ckpt.load_model(run_dir / "checkpoints" / "step_4")
    for a, b in zip(first.model.parameters(), saved_on_cuda.parameters(), strict=True):
        assert torch.equal(a.detach().cpu(), b)
    back = run(run_dir, "trainer.max_steps=12", "trainer.val_every=4", "trainer.device=cuda",
               "trainer.resume=auto", "trainer.precision=fp32")
    assert back.state.step == 12 and back.state.skipped_steps == 0
    state = back.optimizer.state_dict()["state"]
    assert all(v["exp_avg"].device.type == "cuda" for v in state.values())
    assert all(torch.isfinite(p).all() for p in back.model.parameters())


def test_a_checkpoint_loads_onto_either_device(tmp_path):
    path = tiny_checkpoint(tmp_path / "ck")
    on_gpu, _ = ckpt.load_model(path, "cuda")
    on_cpu, _ = ckpt.load_model(path, "cpu")
    assert next(on_gpu.parameters()).device.type == "cuda"
    for a, b in zip(on_gpu.state_dict().values(), on_cpu.state_dict().values(), strict=True):
        assert torch.equal(a.cpu(), b)


# ---- CTranslate2 on CUDA ----------------------------------------------------------------


def ctranslate2_on_cuda():
    """ctranslate2, or a skip saying why it cannot run on this GPU."""
    ct2 = pytest.importorskip("ctranslate2")
    if ct2.get_cuda_device_count() == 0:
        pytest.skip(f"this ctranslate2 {ct2.__version__} wheel has no CUDA (or sees no GPU)")
    return ct2


def test_a_ctranslate2_export_translates_on_cuda_as_on_the_cpu(tmp_path):
    ct2 = ctranslate2_on_cuda()
    from transformer.commands.export import export
    from transformer.decoding.ct2_model import CT2Model
    from transformer.deploy.ct2_export import ExportConfig

    out = export(ExportConfig(checkpoint=str(tiny_checkpoint(tmp_path / "ck", seed=2)),
                              output=str(tmp_path / "export")))
    cfg = DecodeConfig(method="beam", beam_size=3, max_len_a=1.0, max_len_b=5)
    try:
        on_gpu = CT2Model(out, "cuda").search(SRC, cfg)
    except (RuntimeError, OSError) as e:  # e.g. the wheel's CUDA libraries are not on this machine
        if "lib" in str(e) or "CUDA" in str(e):
            pytest.skip(f"ctranslate2 {ct2.__version__} cannot run on this GPU: {str(e)[:200]}")
        raise
    on_cpu = CT2Model(out, "cpu").search(SRC, cfg)
    for g, c in zip(on_gpu, on_cpu, strict=True):
        assert [h.tokens for h in g] == [h.tokens for h in c]
