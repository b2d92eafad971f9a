"""transformer/training/trainer.py: the update reads nothing back in the steady state (a
count of the host's reads, `device.HostReads`), and it learns what the simple eager loop
learns (each update's loss and the weights against a reference written the plain way:
`.item()`, an `if` on the gradient norm, `scheduler.step()`). In short debug runs: the
logged loss is the window's token-weighted mean and the logged lr the update's own,
accumulation equals one update on the
union, patience and the last update's validation, `best` made of step_N's files (the
weights written once), exact resume, SIGTERM saves and stops, a
non-finite step is skipped, fp16 needs CUDA, an interrupted checkpoint write leaves the
previous one, the CPU heap is trimmed. Under DDP, compiled or not, an update all-reduces in
its last micro-batch's backward only."""

from __future__ import annotations

import collections
import copy
import itertools
import math
import os
import re
import signal
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel
from torch.utils._python_dispatch import TorchDispatchMode

from transformer import checkpoint as ckpt
from transformer import device as device_module
from transformer.device import HostReads
from transformer.metrics.name_copy import NameCopy
from transformer.model import dropout as dropout_module
from transformer.model.attention import set_attention_path
from transformer.training.loss import batch_loss
from transformer.training.optimizer import build_optimizer, build_scheduler, inverse_sqrt_lr
from transformer.training.trainer import Trainer
from transformer.training.validation import DevResult

from helpers import run, scalars

NO_DROPOUT = ["model.dropout=0", "model.attn_dropout=0", "model.ffn_dropout=0"]


@pytest.fixture
def device_code_paths(monkeypatch):
    """Run what a GPU runs: attention through SDPA and dropout through F.dropout. The CPU's
    own fast paths read CPU values (the numpy dropout mask's seed, drawn from torch's
    generator; the explicit attention's check for empty rows), which cost no wait on a CPU
    and are never taken on a GPU."""
    monkeypatch.setattr(dropout_module, "dropout", lambda x, p, training: F.dropout(x, p, training))


def steady_state_reads(trainer, updates: int, accum: int = 1, poison: bool = False) -> HostReads:
    """The host's reads over `updates` updates after a warm-up one, as `fit` drives them: an
    update, then a read of the meter when the loop is due one (`_due`: the log grid, here).
    `poison`: every counted update's gradient is inf."""
    set_attention_path(trainer.model, True)
    trainer.tc.max_steps = 1_000_000  # the run that built it ended; these updates are mid-run
    stream = trainer._micro_batches()
    batches = [[next(stream)[2][0] for _ in range(accum)] for _ in range(updates)]
    trainer.train_step(batches[0])  # warm-up: the optimizer's state, the allocator
    trainer.read_and_recount()
    if poison:
        trainer.model.src_embed.weight.register_hook(lambda g: g * math.inf)
    with HostReads(sites=True) as reads:
        for micro in batches[1:]:
            trainer.train_step(micro)
            if trainer._due():
                trainer.read_and_recount()
    return reads


@pytest.mark.parametrize(("precision", "accum"), [("fp32", 1), ("bf16", 1), ("fp32", 3)])
def test_the_steady_state_reads_once_per_log_interval(tmp_path, device_code_paths, precision, accum):
    trainer = run(tmp_path / "run", "trainer.max_steps=1", "trainer.log_every=10", "trainer.val_every=1000",
                  f"trainer.precision={precision}", f"trainer.accum_steps={accum}")
    reads = steady_state_reads(trainer, 21, accum)  # updates 3..22 counted: the log grid at 10 and 20
    assert reads.total == 2, reads.by_site
    assert set(reads.by_op) == {"tolist"} and all(site.startswith("update_meter.py") for site in reads.by_site)
    assert trainer.state.step == 22 and trainer.state.skipped_steps == 0


def test_skipped_updates_are_read_when_due_and_then_every_update_until_one_applies(tmp_path, device_code_paths):
    trainer = run(tmp_path / "run", "trainer.max_steps=1", "trainer.log_every=10", "trainer.val_every=1000",
                  "trainer.diverge_after=100")
    reads = steady_state_reads(trainer, 13, poison=True)  # 12 skipped, counted as updates 3..14
    assert reads.total == 5, reads.by_site  # at 10 (8 skipped found), then at each of the next 4
    assert trainer.state.step == 2 and trainer.state.skipped_steps == 12


class DispatchedOps(TorchDispatchMode):
    """Counts the ops that reach the backend (after autograd and autocast), views apart:
    on a GPU each is a kernel launch or more."""

    VIEWS = frozenset({"view", "transpose", "unsqueeze", "slice", "expand", "t", "_unsafe_view", "flatten",
                       "select", "detach", "alias", "reshape", "squeeze", "as_strided", "permute",
                       "_reshape_alias", "lift_fresh", "split", "unbind", "split_with_sizes", "narrow",
                       "unflatten", "view_as", "expand_as", "diagonal", "chunk"})

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in self.VIEWS:
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))


def test_an_eager_bf16_update_dispatches_few_ops(tmp_path, device_code_paths):
    """Ops per update on the path a GPU runs (SDPA, F.dropout, bf16 autocast), tiny model:
    the Linear weights cast once an update (`LowPrecisionWeights`: two ops, not two per
    tensor), decoder self-attention `is_causal`, the key padding built once per forward,
    the q/k/v projections one product. Per update, 3 after 2 of warm-up: 609 ops, 100 of
    them casts (799 and 228 when every use cast its weight and every attention call built
    and mended its mask)."""
    trainer = run(tmp_path / "run", "trainer.max_steps=1", "trainer.log_every=10", "trainer.val_every=1000",
                  "trainer.precision=bf16")
    set_attention_path(trainer.model, True)
    trainer.tc.max_steps = 1_000_000
    stream = trainer._micro_batches()
    batches = [[next(stream)[2][0]] for _ in range(5)]
    for micro in batches[:2]:
        trainer.train_step(micro)
    with DispatchedOps() as ops:
        for micro in batches[2:]:
            trainer.train_step(micro)
    per_update = sum(ops.counts.values()) / 3
    assert per_update <= 680, ops.counts.most_common(12)
    assert ops.counts["_to_copy"] / 3 <= 120, ops.counts.most_common(12)


def test_the_compiled_step_compiles_once_over_30_updates_of_varied_shapes_and_validations(tmp_path, monkeypatch):
    """trainer.compile=true, fp32, on a CPU with dynamo's `aot_eager` backend (the graphs
    dynamo and AOT autograd capture, without inductor's minutes of code generation on a
    loaded 2-core CPU), driven by `fit` on the sample corpus: 30 updates of at least 10
    batch shapes, with a validation after every 10, make at most 2 graphs (it makes 1:
    batches, source and target lengths are dynamic from the first compile) and no graph
    break; train.log says once how long the first compile took. The first 5 updates'
    losses equal an eager run's within 1e-4 relative."""
    from torch._dynamo.utils import counters

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, backend="aot_eager", **kw))
    seen: dict[str, list] = {"eager": [], "compiled": []}
    real_step, real_validate = Trainer.train_step, Trainer.validate
    validations = []

    def recording(self, batches):
        out = real_step(self, batches)
        b = batches[0]
        shape = (*b.src_ids.shape, b.tgt_in_ids.size(1), b.n_tgt_tokens)
        seen["compiled" if self.forward.compiled else "eager"].append((shape, out["loss_sum"].item()))
        return out

    monkeypatch.setattr(Trainer, "train_step", recording)
    monkeypatch.setattr(Trainer, "validate", lambda self: validations.append(self.state.step) or real_validate(self))
    args = (*NO_DROPOUT, "trainer.log_every=10", "trainer.val_every=10", "trainer.val_bleu_sentences=2",
            "trainer.precision=fp32")
    run(tmp_path / "eager", *args, "trainer.max_steps=5", "trainer.compile=false")
    torch._dynamo.reset()
    counters.clear()
    compiled = run(tmp_path / "compiled", *args, "trainer.max_steps=30", "trainer.compile=true")
    assert compiled.forward.compiled and compiled.state.step == 30 and validations[-3:] == [10, 20, 30]
    shapes = {shape for shape, _ in seen["compiled"]}
    assert len(seen["compiled"]) == 30 and len(shapes) >= 10, shapes
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert 1 <= counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])
    losses = {name: [loss for _, loss in steps[:5]] for name, steps in seen.items()}
    torch.testing.assert_close(losses["compiled"], losses["eager"], rtol=1e-4, atol=0)
    logged = (tmp_path / "compiled" / "train.log").read_text()
    assert len(re.findall(r"compiled the training step in \d+\.\d s \(the first update's forward and "
                          r"backward\)", logged)) == 1, logged


@pytest.fixture
def group_of_one(monkeypatch):
    """This process as rank 0 of a one-process gloo group, as `torchrun --nproc_per_node=1`
    starts a worker: the trainer wraps its model in DDP. The group outlives the runs
    (`train` would end it), so that a test drives further updates, and ends with the test."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for var, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(port)).items():
        monkeypatch.setenv(var, value)
    end_group = dist.destroy_process_group
    monkeypatch.setattr(dist, "destroy_process_group", lambda *args, **kwargs: None)
    yield
    if dist.is_initialized():
        end_group()


def all_reduces_and_gradients(trainer, batches, monkeypatch) -> tuple[list[int], list[int], dict]:
    """Two updates under DDP, one of `batches`, one of its first micro-batch alone: the
    buckets all-reduced so far after each backward (a counting comm hook around DDP's
    all-reduce), the buckets of the whole run, and the gradients the first update applies."""
    buckets, after_each_backward, grads = [], [], {}

    def counted(state, bucket):
        buckets.append(bucket.index())
        return default_hooks.allreduce_hook(state, bucket)

    def recording_step(*args, step=trainer.optimizer.step, **kwargs):
        grads.update((n, p.grad.clone()) for n, p in trainer.model.named_parameters() if n not in grads)
        return step(*args, **kwargs)

    trainer.ddp.register_comm_hook(None, counted)
    monkeypatch.setattr(trainer.forward, "after_backward", lambda first: after_each_backward.append(len(buckets)))
    monkeypatch.setattr(trainer.optimizer, "step", recording_step)
    trainer.train_step(batches)
    trainer.train_step(batches[:1])
    return after_each_backward, buckets, grads


def test_under_ddp_compiled_or_not_only_an_updates_last_backward_all_reduces(tmp_path, monkeypatch,
                                                                              group_of_one):
    """Gradient accumulation under DDP holds back the all-reduce (`no_sync` on the DDP
    module) for all but an update's last micro-batch, also when `trainer.compile` wraps DDP
    (aot_eager on a CPU): an update of 3 micro-batches all-reduces in its third backward
    only, as many buckets as an update of one, and its gradients are the eager run's."""
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, backend="aot_eager", **kw))
    torch._dynamo.reset()
    args = (*NO_DROPOUT, "trainer.max_steps=1", "trainer.val_every=1000", "trainer.precision=fp32",
            "trainer.accum_steps=3")
    eager = run(tmp_path / "eager", *args, "trainer.compile=false")
    compiled = run(tmp_path / "compiled", *args, "trainer.compile=true")
    weights = {k: v.clone() for k, v in eager.model.state_dict().items()}
    stream = eager._micro_batches()
    batches = [next(stream)[2][0] for _ in range(3)]
    grads = {}
    for name, trainer in (("eager", eager), ("compiled", compiled)):
        assert isinstance(trainer.ddp, DistributedDataParallel) and trainer.forward.compiled == (name == "compiled")
        trainer.model.load_state_dict(weights)
        after_each_backward, buckets, grads[name] = all_reduces_and_gradients(trainer, batches, monkeypatch)
        n = len(buckets) // 2  # an update's buckets
        assert n >= 1 and after_each_backward == [0, 0, n, 2 * n], (name, after_each_backward)
    for name, g in grads["eager"].items():
        torch.testing.assert_close(grads["compiled"][name], g, rtol=1e-4, atol=1e-6, msg=name)
    assert any(g.abs().sum() > 0 for g in grads["eager"].values())


def reference_updates(model, optimizer, scheduler, batches, label_smoothing: float, clip: float,
                      poison: int) -> list[float]:
    """The plain eager loop: each update's mean loss, read with `.item()`; a non-finite
    gradient norm skips the update on the host (update `poison`'s gradient is made inf)."""
    losses = []
    for i, batch in enumerate(batches):
        model.train()
        loss, _ = batch_loss(model, batch, label_smoothing, "fp32", torch.device("cpu"))
        (loss / batch.n_tgt_tokens).backward()
        if i == poison:
            model.src_embed.weight.grad.fill_(math.inf)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if math.isfinite(norm.item()):
            optimizer.step()
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item() / batch.n_tgt_tokens)
    return losses


def test_the_loop_learns_what_the_eager_loop_learns_skips_included(tmp_path):
    """Same start, same batches: the same loss at every update and the same weights, with
    update 4 skipped (its gradient inf): the schedule does not move for it either."""
    trainer = run(tmp_path / "run", *NO_DROPOUT, "trainer.max_steps=1", "trainer.val_every=1000")
    model = type(trainer.model)(trainer.model.cfg)
    model.load_state_dict(trainer.model.state_dict())
    optimizer = build_optimizer(model, trainer.cfg.optim, torch.device("cpu"))
    scheduler = build_scheduler(optimizer, trainer.cfg.optim)
    optimizer.load_state_dict(copy.deepcopy(trainer.optimizer.state_dict()))  # as a resume loads them
    scheduler.load_state_dict(trainer.scheduler.state_dict())
    stream = trainer._micro_batches()
    batches = [next(stream)[2][0] for _ in range(12)]
    poison = 4
    expected = reference_updates(model, optimizer, scheduler, batches, trainer.cfg.optim.label_smoothing,
                                 trainer.cfg.optim.clip_norm, poison)
    trainer.update.start(trainer.state.step)
    got = []
    for i, batch in enumerate(batches):
        hook = trainer.model.src_embed.weight.register_hook(lambda g: g * math.inf) if i == poison else None
        metrics = trainer.train_step([batch])
        if hook:
            hook.remove()
        got.append(float(metrics["loss_sum"]) / metrics["tokens"])
    trainer.read_and_recount()
    assert trainer.state.step == 1 + 11 and trainer.state.skipped_steps == 1
    assert scheduler.get_last_lr() == pytest.approx(trainer.scheduler.get_last_lr(), rel=1e-15)
    assert got == pytest.approx(expected, rel=1e-6)
    for (name, a), b in zip(trainer.model.state_dict().items(), model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7, msg=name)


def test_logged_loss_is_the_token_weighted_mean_of_the_window(tmp_path, monkeypatch):
    """Not the last batch's loss, which jumps with its length bucket (fairseq logs the same)."""
    steps = []
    real_step = Trainer.train_step

    def recording(self, batches):
        out = real_step(self, batches)
        steps.append(out)
        return out

    monkeypatch.setattr(Trainer, "train_step", recording)
    run(tmp_path / "run", "trainer.max_steps=10", "trainer.log_every=5", "trainer.val_every=100")
    logged = dict(scalars(tmp_path / "run", "train/loss"))
    for end in (5, 10):
        window = steps[end - 5 : end]
        mean = sum(float(m["loss_sum"]) for m in window) / sum(m["tokens"] for m in window)
        assert logged[end] == pytest.approx(mean, rel=1e-6)
        assert logged[end] != pytest.approx(float(window[-1]["loss_sum"]) / window[-1]["tokens"], rel=1e-6)
    log_lines = [line for line in (tmp_path / "run" / "train.log").read_text().splitlines()
                 if "step 5: loss" in line]
    assert f"step 5: loss {logged[5]:.3f}" in log_lines[0]


@pytest.mark.parametrize("fused", [True, False])
def test_the_logged_lr_is_the_one_the_logged_update_ran_with(tmp_path, fused):
    """TensorBoard's train/lr and the log line at step N give update N's lr, so the peak
    (update warmup_steps's) appears; the fused update's own lr tensor says the same."""
    trainer = run(tmp_path / "run", "trainer.max_steps=12", "trainer.log_every=1", "trainer.val_every=100",
                  f"optim.fused={str(fused).lower()}")
    peak, warmup = trainer.cfg.optim.lr, trainer.cfg.optim.warmup_steps
    logged = dict(scalars(tmp_path / "run", "train/lr"))
    assert sorted(logged) == list(range(1, 13))
    for step, lr in logged.items():
        assert lr == pytest.approx(inverse_sqrt_lr(step, peak, warmup), rel=1e-6), step
    assert logged[warmup] == pytest.approx(peak, rel=1e-6) == max(logged.values())
    if trainer.update.on_device:
        assert float(trainer.update.lr) == pytest.approx(logged[12], rel=1e-6)  # what update 12 applied
    line = next(line for line in (tmp_path / "run" / "train.log").read_text().splitlines()
                if f"step {warmup}: loss" in line)
    assert f"lr {peak:.2e}" in line


def test_gradient_accumulation_equals_one_update_on_the_union(tmp_path):
    """N micro-batches accumulated give the update of one batch holding all their pairs."""
    trainer = run(tmp_path / "run", *NO_DROPOUT, "trainer.max_steps=1", "trainer.val_every=100")
    model_state = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    opt_state = copy.deepcopy(trainer.optimizer.state_dict())
    sched_state = copy.deepcopy(trainer.scheduler.state_dict())
    tok = trainer.tokenizer
    rows = [trainer.sampler.batches(1)[i] for i in (0, 1, 2)]
    micro = [trainer.train_ids.collate_rows(np.asarray(r), tok.pad_id, tok.bos_id, tok.eos_id) for r in rows]
    union = trainer.train_ids.collate_rows(np.asarray([i for r in rows for i in r]), tok.pad_id, tok.bos_id,
                                           tok.eos_id)
    grads = []  # the gradient each update applies, as the optimizer sees it
    step = trainer.optimizer.step

    def recording_step(*args, **kwargs):
        grads.append({n: p.grad.clone() for n, p in trainer.model.named_parameters()})
        return step(*args, **kwargs)

    trainer.optimizer.step = recording_step
    accumulated = trainer.train_step(micro)
    trainer.model.load_state_dict(model_state)
    trainer.optimizer.load_state_dict(opt_state)
    trainer.scheduler.load_state_dict(sched_state)
    whole = trainer.train_step([union])
    assert accumulated["tokens"] == whole["tokens"]
    assert float(accumulated["loss_sum"]) == pytest.approx(float(whole["loss_sum"]), rel=1e-5)
    assert float(accumulated["grad_norm"]) == pytest.approx(float(whole["grad_norm"]), rel=1e-4)
    for name, g in grads[0].items():
        torch.testing.assert_close(g, grads[1][name], rtol=1e-4, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in grads[0].values())


def test_patience_stops_after_that_many_validations_without_a_better_score(tmp_path, monkeypatch):
    scores = iter([5.0, 7.0, 6.0, 7.0, 1.0, 9.0])  # best at the 2nd validation, then 3 worse

    def fake_validate(self):
        bleu = next(scores)
        return {"sample": DevResult(loss=1.0, nll=1.0, ppl=2.7, bleu=bleu, chrf=bleu,
                                     names=NameCopy(names=2, copied=1, sentences=2), examples=[])}

    monkeypatch.setattr(Trainer, "validate", fake_validate)
    trainer = run(tmp_path / "run", "trainer.max_steps=100", "trainer.val_every=2", "trainer.patience=3")
    assert trainer.state.step == 10  # validations at 2, 4 (best), 6, 8, 10: three without progress
    assert trainer.state.best_bleu == 7.0 and trainer.state.bad_validations == 3
    assert ckpt.load_meta(tmp_path / "run" / "checkpoints" / "best")["step"] == 4


def test_a_better_validation_writes_the_weights_once_for_best_and_step_n(tmp_path, monkeypatch):
    """`best` is not a second write of the weights: one serialisation a validation, better
    or not; `best` is then step_N's files (hard links) without the trainer state."""
    scores = iter([5.0, 7.0, 6.0])  # better, better, worse
    written = []
    serialise = ckpt.save_safetensors

    def fake_validate(self):
        bleu = next(scores)
        return {"sample": DevResult(loss=1.0, nll=1.0, ppl=2.7, bleu=bleu, chrf=bleu,
                                     names=NameCopy(names=2, copied=1, sentences=2), examples=[])}

    monkeypatch.setattr(Trainer, "validate", fake_validate)
    monkeypatch.setattr(ckpt, "save_safetensors", lambda model, path: written.append(path) or serialise(model, path))
    trainer = run(tmp_path / "run", "trainer.max_steps=6", "trainer.val_every=2", "trainer.keep_last=0")
    folder = tmp_path / "run" / "checkpoints"
    assert len(written) == 3  # step_2, step_4, step_6
    assert trainer.state.best_bleu == 7.0 and ckpt.load_meta(folder / "best")["step"] == 4
    assert sorted(p.name for p in (folder / "best").iterdir()) == sorted(
        p.name for p in (folder / "step_4").iterdir() if p.name != ckpt.STATE)
    for f in (folder / "best").iterdir():
        assert f.samefile(folder / "step_4" / f.name), f.name


def test_the_last_update_is_validated_even_off_the_validation_grid(tmp_path, monkeypatch):
    """max_steps not a multiple of val_every: the final weights are scored and can be `best`."""
    scores = iter([3.0, 5.0])

    def fake_validate(self):
        bleu = next(scores)
        return {"sample": DevResult(loss=1.0, nll=1.0, ppl=2.7, bleu=bleu, chrf=bleu,
                                     names=NameCopy(names=2, copied=1, sentences=2), examples=[])}

    monkeypatch.setattr(Trainer, "validate", fake_validate)
    trainer = run(tmp_path / "run", "trainer.max_steps=7", "trainer.val_every=5", "trainer.save_every=1")
    assert trainer.state.step == 7 and trainer.state.best_bleu == 5.0
    assert ckpt.load_meta(tmp_path / "run" / "checkpoints" / "best")["step"] == 7
    finished = run(tmp_path / "run", "trainer.max_steps=7", "trainer.val_every=5", "trainer.save_every=1",
                   "trainer.resume=auto")
    assert finished.state.best_bleu == 5.0  # resuming a finished run validates nothing again


def test_resume_gives_the_same_losses_as_an_uninterrupted_run(tmp_path):
    common = ["trainer.log_every=1", "trainer.val_every=100", "trainer.resume=auto"]
    run(tmp_path / "straight", *common, "trainer.max_steps=8")
    run(tmp_path / "split", *common, "trainer.max_steps=4")
    resumed = run(tmp_path / "split", *common, "trainer.max_steps=8")
    assert resumed.state.step == 8  # a resumed run reaches max_steps, never quits early
    straight = scalars(tmp_path / "straight", "train/loss")
    split = scalars(tmp_path / "split", "train/loss")
    assert [s for s, _ in split] == list(range(1, 9))
    assert split == straight


AUGMENT = ["data.augment.upper=0.3", "data.augment.title=0.2", "data.augment.nopunct=0.3",
           "data.augment.typos=0.3", "data.augment.merge=0.2"]


def test_an_augmented_run_resumed_trains_on_exactly_the_batches_of_an_uninterrupted_one(tmp_path, monkeypatch):
    """data.augment draws per (seed, epoch, row): a resume mid-epoch (and across the epoch's
    end) sees the same changed pairs, in the same pieces, with the same losses; the dev
    sets are the plain run's."""
    seen: dict[str, list] = collections.defaultdict(list)
    real_step = Trainer.train_step

    def recorded(self, batches):
        seen[self.tc.run_dir].append([(b.src_ids.tolist(), b.tgt_out_ids.tolist()) for b in batches])
        return real_step(self, batches)

    monkeypatch.setattr(Trainer, "train_step", recorded)
    common = ["trainer.log_every=1", "trainer.val_every=100", "trainer.resume=auto", "data.max_tokens=512",
              *AUGMENT]
    straight = run(tmp_path / "straight", *common, "trainer.max_steps=14")
    run(tmp_path / "split", *common, "trainer.max_steps=5")
    resumed = run(tmp_path / "split", *common, "trainer.max_steps=14")
    assert straight.state.epoch >= 1  # the run went past an epoch's end
    assert seen[str(tmp_path / "split")] == seen[str(tmp_path / "straight")]
    assert scalars(tmp_path / "split", "train/loss") == scalars(tmp_path / "straight", "train/loss")
    assert any(len(step) > 1 for step in seen[str(tmp_path / "straight")])  # a batch was cut in pieces
    plain = run(tmp_path / "plain", *common[:-len(AUGMENT)], "trainer.max_steps=2")
    assert seen[str(tmp_path / "plain")] != seen[str(tmp_path / "straight")][:2]
    for name, batches in plain.validator.batches.items():
        assert [b.src_ids.tolist() for b in batches] == [b.src_ids.tolist() for b in resumed.validator.batches[name]]


def test_sigterm_saves_a_checkpoint_and_stops(tmp_path, monkeypatch):
    real_step = Trainer.train_step

    def step_then_signal(self, batches):
        out = real_step(self, batches)
        if self.state.step == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(Trainer, "train_step", step_then_signal)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        trainer = run(tmp_path / "run", "trainer.max_steps=50")
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    assert trainer.state.step == 3
    assert [p.name for p in ckpt.step_checkpoints(tmp_path / "run")] == ["step_3"]
    assert ckpt.load_trainer_state(tmp_path / "run" / "checkpoints" / "step_3")["train_state"]["step"] == 3


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_step_with_an_inf_gradient_is_skipped(tmp_path, precision):
    trainer = run(tmp_path / "run", "trainer.max_steps=2", f"trainer.precision={precision}")
    batches = [next(trainer._micro_batches())[2][0]]
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    opt_before = trainer.optimizer.state_dict()["state"][0]["exp_avg"].clone()
    handle = trainer.model.src_embed.weight.register_hook(lambda g: g * float("inf"))
    metrics = trainer.train_step(batches)
    handle.remove()
    assert trainer.state.step == 3  # counted as applied until the host reads what happened
    trainer.read_and_recount()
    assert not metrics["applied"] and trainer.state.skipped_steps == 1 and trainer.state.step == 2
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert torch.equal(trainer.optimizer.state_dict()["state"][0]["exp_avg"], opt_before)
    assert trainer.train_step(batches)["applied"] and trainer.read_and_recount() and trainer.state.step == 3


def test_fp16_on_cpu_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="fp16 needs CUDA"):
        run(tmp_path / "run", "trainer.precision=fp16", "trainer.device=cpu")


def test_an_interrupted_checkpoint_write_leaves_the_previous_one_loadable(tmp_path, monkeypatch):
    trainer = run(tmp_path / "run", "trainer.max_steps=10")
    good = ckpt.step_checkpoints(tmp_path / "run")[-1]

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("power cut while writing the trainer state")

    monkeypatch.setattr(torch, "save", crash)
    trainer.state.step = 11
    with pytest.raises(KeyboardInterrupt):
        trainer.save("step_11")
    monkeypatch.undo()
    assert ckpt.step_checkpoints(tmp_path / "run")[-1] == good  # the half-written one is ignored
    ckpt.load_model(good)
    assert ckpt.load_trainer_state(good)["train_state"]["step"] == 10
    # Overwriting an existing checkpoint is atomic too: the old copy survives a crash.
    monkeypatch.setattr(torch, "save", crash)
    trainer.state.step = 10
    with pytest.raises(KeyboardInterrupt):
        trainer.save("step_10")
    monkeypatch.undo()
    assert ckpt.load_trainer_state(good)["train_state"]["step"] == 10


def test_training_on_cpu_trims_the_heap_and_logs_its_memory(tmp_path, monkeypatch):
    # the heap grows by 1 MB between two looks, whatever this process freed before the run
    # (real memory may only shrink over five tiny updates, and then nothing is trimmed)
    grown = itertools.count()
    real = device_module.anonymous_memory
    monkeypatch.setattr(device_module, "anonymous_memory", lambda: real() + 2**20 * next(grown))
    trainer = run(tmp_path / "run", "trainer.max_steps=5", "trainer.log_every=5", "trainer.heap_slack_gb=1e-9")
    assert trainer.trim_heap.trims >= 1 or trainer.trim_heap.libc is None
    (step, gb), = scalars(tmp_path / "run", "train/cpu_mem_gb")
    assert step == 5 and 0.01 < gb < 20
