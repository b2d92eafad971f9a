"""The training state a checkpoint carries: it round-trips through torch.load(weights_only=True)
and restores weights, optimizer, schedule, scaler, RNGs and position exactly; the format's keys
stay those older checkpoints have; rotation prunes only this run's own step checkpoints (a
`best` linked to one outlives it); a failed resume changes nothing and an unreadable newest
checkpoint falls back to the next; a resume with another tokenizer is refused; a resume
with other batching settings trains on every pair of the epoch once."""

from __future__ import annotations

import copy
import dataclasses
import logging
import random
from collections import Counter

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from transformer import checkpoint as ckpt
from transformer.config import ModelConfig, OptimConfig, TrainerConfig
from transformer.model.transformer import build_model
from transformer.training import trainer as trainer_module
from transformer.training.optimizer import build_optimizer, build_scheduler, inverse_sqrt_lr
from transformer.training.run_dir import RunDirError
from transformer.training.state import Checkpoints, TrainState

from helpers import run, sample_tokenizer

CPU = torch.device("cpu")


def checkpoints(run_dir, tokenizer=None, seed=0, **trainer) -> Checkpoints:
    """A run's Checkpoints over a fresh tiny model (weights from `seed`) and its optimizer."""
    tokenizer = tokenizer or sample_tokenizer()
    torch.manual_seed(seed)
    model = build_model(ModelConfig(vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, d_ff=32,
                                    n_encoder_layers=1, n_decoder_layers=1, max_positions=32))
    optimizer = build_optimizer(model, OptimConfig(), CPU)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    tc = TrainerConfig(run_dir=str(run_dir), **trainer)
    return Checkpoints(tc, "seed: 1\n", model, tokenizer, optimizer, build_scheduler(optimizer, OptimConfig()),
                       scaler)


def update(c: Checkpoints) -> None:
    """One real optimizer update: the weights, Adam's moments and the schedule all move."""
    c.model.train()
    ids = torch.randint(4, c.tokenizer.vocab_size, (2, 5))
    c.model(ids, ids).float().pow(2).mean().backward()
    c.optimizer.step()
    c.scheduler.step()
    c.optimizer.zero_grad(set_to_none=True)


def test_the_trainer_state_loads_with_weights_only_and_keeps_its_keys(tmp_path):
    c = checkpoints(tmp_path / "run")
    update(c)
    state = TrainState(step=1, epoch=2, batch_index=3, skipped_steps=4, best_bleu=5.5, bad_validations=6,
                       train_seconds=7.25)
    path = c.save("step_1", state)
    with open(path / "trainer_state.pt", "rb") as f:
        saved = torch.load(f, weights_only=True)  # no pickled classes: plain containers and tensors
    # The keys a checkpoint written before this module existed has, and a resume reads, and
    # what a resume compares (older checkpoints lack them: `load` does without)
    assert set(saved) == {"optimizer", "scheduler", "scaler", "rng", "train_state", "schedule", "batching"}
    assert saved["train_state"] == dataclasses.asdict(state)
    assert set(saved["train_state"]) == {f.name for f in dataclasses.fields(TrainState)}
    meta = ckpt.load_meta(path)
    assert (meta["step"], meta["epoch"], meta["best_bleu"], meta["train_seconds"]) == (1, 2, 5.5, 7.25)


def test_load_restores_everything_exactly(tmp_path):
    c = checkpoints(tmp_path / "run")
    update(c)
    state = TrainState(step=1, epoch=0, batch_index=9, best_bleu=3.0)
    c.save("step_1", state)
    as_saved = copy.deepcopy(c)  # weights, Adam's moments, schedule: the checkpoint's
    next_draws = (torch.rand(3), random.random(), np.random.rand())
    update(c)  # the run goes on: everything moves past the checkpoint
    random.seed(5)
    np.random.seed(5)

    resumed = checkpoints(tmp_path / "run", seed=1)  # another model, its own RNG state
    assert resumed.load(tmp_path / "run" / "checkpoints" / "step_1", CPU) == state
    draws = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(draws[0], next_draws[0]) and draws[1:] == next_draws[1:]
    for k, v in resumed.model.state_dict().items():
        assert torch.equal(v, as_saved.model.state_dict()[k]), k
    # The next update from the restored state is the one the saved state would have made.
    for one in (resumed, as_saved):
        torch.manual_seed(7)
        update(one)
    assert resumed.scheduler.get_last_lr() == as_saved.scheduler.get_last_lr()
    for k, v in resumed.model.state_dict().items():
        assert torch.equal(v, as_saved.model.state_dict()[k]), k


def test_a_checkpoint_with_another_tokenizer_is_refused_before_anything_changes(tmp_path):
    c = checkpoints(tmp_path / "run")
    c.save("step_1", TrainState(step=1))
    other = checkpoints(tmp_path / "other", tokenizer=sample_tokenizer(250), seed=1)
    before = {k: v.clone() for k, v in other.model.state_dict().items()}
    with pytest.raises(RunDirError, match="tokenizer differs"):
        other.load(tmp_path / "run" / "checkpoints" / "step_1", CPU)
    for k, v in other.model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_resume_falls_back_past_an_unreadable_checkpoint_but_not_past_the_last(tmp_path, caplog):
    c = checkpoints(tmp_path / "run", keep_last=0)
    older = c.save("step_1", TrainState(step=1))
    newer = c.save("step_2", TrainState(step=2))
    (newer / "trainer_state.pt").write_bytes(b"truncated")
    with caplog.at_level(logging.WARNING):
        path, state = c.resume([newer, older], CPU)
    assert path == older and state.step == 1
    assert f"cannot resume from {newer}" in caplog.text and "falling back to step_1" in caplog.text
    with pytest.raises(ckpt.CheckpointError, match=r"trainer_state\.pt"):
        c.resume([newer], CPU)
    assert c.resume([], CPU) is None  # a new run


def test_rotation_keeps_the_last_n_of_this_runs_step_checkpoints(tmp_path):
    stranger = checkpoints(tmp_path / "run").save("step_0", TrainState())  # not this run's
    c = checkpoints(tmp_path / "run", keep_last=2)
    for step in range(1, 5):
        c.save(f"step_{step}", TrainState(step=step))
    c.save("best", TrainState(step=4), with_state=False)
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert names == ["best", "step_0", "step_3", "step_4"]
    assert stranger.is_dir()
    assert not (tmp_path / "run" / "checkpoints" / "best" / "trainer_state.pt").exists()
    assert c.newest().name == "step_4"
    assert checkpoints(tmp_path / "empty").newest() is None


def test_best_beside_a_step_checkpoint_is_this_runs_and_outlives_its_pruning(tmp_path):
    c = checkpoints(tmp_path / "run", keep_last=1)
    step_1 = c.save("step_1", TrainState(step=1, best_bleu=3.0), also="best")
    best = tmp_path / "run" / "checkpoints" / "best"
    assert "best" in c.owned and (best / "model.safetensors").samefile(step_1 / "model.safetensors")
    assert not (best / "trainer_state.pt").exists() and ckpt.load_meta(best) == ckpt.load_meta(step_1)
    c.save("step_2", TrainState(step=2))
    assert not step_1.exists() and ckpt.load_meta(best)["step"] == 1
    model, _ = ckpt.load_model(best)
    for k, v in c.model.state_dict().items():
        assert torch.equal(v, model.state_dict()[k]), k


def test_ranks_other_than_zero_write_nothing(tmp_path):
    c = checkpoints(tmp_path / "run")
    c.is_main = False
    assert c.save("step_1", TrainState(step=1)) is None
    assert not (tmp_path / "run").exists()


def test_resuming_with_a_different_vocabulary_is_a_clear_error(tmp_path):
    run(tmp_path / "run", "trainer.max_steps=2")
    with pytest.raises(RunDirError, match="tokenizer differs"):
        run(tmp_path / "run", "trainer.max_steps=4", "trainer.resume=auto", "data.spm_vocab_size=250")


def test_a_resume_with_a_new_schedule_applies_it_from_the_resumed_step_and_says_so(tmp_path):
    """`optim.lr` and `optim.warmup_steps` given on resume are the schedule from the resumed
    step on: the host's record (LambdaLR), the update's device-side lr and what is saved
    all follow them, and one line names the old and new values."""
    common = ["trainer.val_every=100", "trainer.resume=auto"]
    first = run(tmp_path / "run", *common, "trainer.max_steps=3")
    peak, warmup = first.cfg.optim.lr, first.cfg.optim.warmup_steps
    resumed = run(tmp_path / "run", *common, "trainer.max_steps=5", f"optim.lr={peak / 2}",
                  f"optim.warmup_steps={warmup * 2}")
    assert resumed.scheduler.base_lrs[0] == resumed.update.peak == peak / 2
    last = inverse_sqrt_lr(5, peak / 2, warmup * 2)  # the 5th update's lr
    if resumed.update.on_device:  # the fused kernel's: what the 5th update applied
        assert float(resumed.update.lr) == pytest.approx(last, rel=1e-6)
    assert resumed.scheduler.get_last_lr()[0] == pytest.approx(inverse_sqrt_lr(6, peak / 2, warmup * 2))
    log = tmp_path / "run" / "train.log"
    lines = [line for line in log.read_text().splitlines() if "new schedule" in line]
    assert len(lines) == 1
    assert f"optim.lr {peak:g} -> {peak / 2:g}" in lines[0]
    assert f"optim.warmup_steps {warmup} -> {warmup * 2}" in lines[0]
    step_5 = tmp_path / "run" / "checkpoints" / "step_5"
    saved = ckpt.load_trainer_state(step_5)
    assert saved["schedule"] == {"lr": peak / 2, "warmup_steps": warmup * 2}
    assert saved["scheduler"]["base_lrs"] == [peak / 2]
    for config in (tmp_path / "run" / "config.yaml", step_5 / "config.yaml"):
        optim = OmegaConf.load(config).optim
        assert (optim.lr, optim.warmup_steps) == (peak / 2, warmup * 2)
    run(tmp_path / "run", *common, "trainer.max_steps=6", f"optim.lr={peak / 2}", f"optim.warmup_steps={warmup * 2}")
    assert log.read_text().count("new schedule") == 1  # resumed again unchanged: no second line


@pytest.mark.parametrize("change", ["data.max_tokens=256", "data.bucket_chunk=1", "data.pad_to_multiple=8",
                                    "trainer.seed=7"])
def test_a_resume_with_other_batching_trains_on_every_pair_of_the_epoch_once(tmp_path, monkeypatch, change):
    """Halving data.max_tokens after an out-of-memory error (or another bucket_chunk,
    padding, seed) and resuming mid-epoch: the pairs trained on in epoch 0, over both
    runs, are every pair once, and one line says what changed."""
    trained: Counter = Counter()
    stream, step = trainer_module.batch_stream, trainer_module.Trainer.train_step

    def with_rows(sampler, ids, tokenizer, epoch, start, *rest):  # each batch knows its rows
        for e, i, pieces in stream(sampler, ids, tokenizer, epoch, start, *rest):
            pieces[0].origin = (e, sampler.batches(e).rows_of(i).tolist())
            yield e, i, pieces

    def recorded(self, batches):
        trained.update(row for b in batches if b.origin[0] == 0 for row in b.origin[1])
        return step(self, batches)

    monkeypatch.setattr(trainer_module, "batch_stream", with_rows)
    monkeypatch.setattr(trainer_module.Trainer, "train_step", recorded)
    common = ["trainer.val_every=100", "trainer.resume=auto"]
    first = run(tmp_path / "run", *common, "trainer.max_steps=4")
    assert first.state.epoch == 0 and sum(trained.values()) < len(first.data.train)
    run(tmp_path / "run", *common, "trainer.max_steps=100", "trainer.max_epochs=1", change)
    assert trained == Counter(range(len(first.data.train)))
    key, value = change.split("=")
    lines = [line for line in (tmp_path / "run" / "train.log").read_text().splitlines() if "other batching" in line]
    assert len(lines) == 1 and f"resumed mid-epoch 0 with other batching ({key} " in lines[0]
    assert f"-> {value}): the epoch goes on with the " in lines[0]
    assert ("trainer.seed 7 takes effect at epoch 1, epoch 0 keeps the order seed 1 drew" in lines[0]) == \
        (key == "trainer.seed")
