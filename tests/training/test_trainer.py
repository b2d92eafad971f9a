"""transformer/training/trainer.py: the update reads nothing back in the steady state (a
count of the host's reads, `device.HostReads`), and it learns what the simple eager loop
learns (each update's loss and the weights against a reference written the plain way:
`.item()`, an `if` on the gradient norm, `scheduler.step()`)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from transformer.device import HostReads
from transformer.model import dropout as dropout_module
from transformer.model.attention import set_attention_path
from transformer.training.loss import batch_loss
from transformer.training.optimizer import build_optimizer, build_scheduler

from helpers import run

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
    batches = [[next(stream)[2] for _ in range(accum)] for _ in range(updates)]
    trainer.train_step(batches[0])  # warm-up: the optimizer's state, the allocator
    trainer.settle()
    if poison:
        trainer.model.src_embed.weight.register_hook(lambda g: g * math.inf)
    with HostReads(sites=True) as reads:
        for micro in batches[1:]:
            trainer.train_step(micro)
            if trainer._due():
                trainer.settle()
    return reads


@pytest.mark.parametrize(("precision", "accum"), [("fp32", 1), ("bf16", 1), ("fp32", 3)])
def test_the_steady_state_reads_once_per_log_interval(tmp_path, device_code_paths, precision, accum):
    trainer = run(tmp_path / "run", "trainer.max_steps=1", "trainer.log_every=10", "trainer.val_every=1000",
                  f"trainer.precision={precision}", f"trainer.accum_steps={accum}")
    reads = steady_state_reads(trainer, 21, accum)  # updates 3..22 counted: the log grid at 10 and 20
    assert reads.total == 2, reads.by_site
    assert set(reads.by_op) == {"tolist"} and all(site.startswith("metrics.py") for site in reads.by_site)
    assert trainer.state.step == 22 and trainer.state.skipped_steps == 0


def test_skipped_updates_are_read_when_due_and_then_every_update_until_one_applies(tmp_path, device_code_paths):
    trainer = run(tmp_path / "run", "trainer.max_steps=1", "trainer.log_every=10", "trainer.val_every=1000",
                  "trainer.diverge_after=100")
    reads = steady_state_reads(trainer, 13, poison=True)  # 12 skipped, counted as updates 3..14
    assert reads.total == 5, reads.by_site  # at 10 (8 skipped found), then at each of the next 4
    assert trainer.state.step == 2 and trainer.state.skipped_steps == 12


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
    batches = [next(stream)[2] for _ in range(12)]
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
    trainer.settle()
    assert trainer.state.step == 1 + 11 and trainer.state.skipped_steps == 1
    assert scheduler.get_last_lr() == pytest.approx(trainer.scheduler.get_last_lr(), rel=1e-15)
    assert got == pytest.approx(expected, rel=1e-6)
    for (name, a), b in zip(trainer.model.state_dict().items(), model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7, msg=name)
