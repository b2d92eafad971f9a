"""A diverging run ends by itself, with one line, its last good checkpoint kept; a second
signal stops at once; non-finite settings are refused before anything runs."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from transformer import checkpoint as ckpt
from transformer.config import ConfigError, OptimConfig, TrainConfig, to_dataclass
from transformer.paths import PROJECT_ROOT
from transformer.training.nan_guard import FP16_MIN_SCALE, DivergenceGuard, TrainingDiverged
from transformer.training.trainer import Trainer
from transformer.training.update_meter import UpdateMeter

from helpers import DEBUG, compose_cfg, run, shared_cache


def count_updates(monkeypatch) -> list[dict]:
    """Record every Trainer.train_step's metrics (applied or skipped)."""
    seen = []
    real = Trainer.train_step

    def recording(self, batches):
        seen.append(real(self, batches))
        return seen[-1]

    monkeypatch.setattr(Trainer, "train_step", recording)
    return seen


def test_an_absurd_learning_rate_stops_within_a_bounded_number_of_updates(tmp_path, monkeypatch):
    updates = count_updates(monkeypatch)
    with pytest.raises(TrainingDiverged) as e:
        run(tmp_path / "run", "optim.lr=1e10", "trainer.max_steps=1000", "trainer.diverge_after=4")
    msg = str(e.value)
    assert "training diverged after update 1: the loss is nan for 4 updates in a row" in msg
    assert "lower optim.lr (now 1e+10)" in msg and "no checkpoint was written" in msg
    # one applied update drives the weights to ~1e9, then exactly diverge_after skipped ones
    assert [u["applied"] for u in updates] == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert not ckpt.step_checkpoints(tmp_path / "run")


def test_the_command_ends_with_one_line_and_a_nonzero_status(tmp_path):
    cmd = [sys.executable, "-m", "transformer.commands.train", *DEBUG, "optim.lr=1e10",
           f"trainer.run_dir={tmp_path / 'run'}", f"data.cache_dir={shared_cache()}"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("mt-train: error: training diverged after update 1: the loss is nan")
    assert "Traceback" not in proc.stderr


def poison_weights_after(monkeypatch, step: int) -> None:
    """Turn one weight NaN right after update `step` (a bad batch, an fp16 overflow)."""
    real = Trainer.train_step

    def poisoning(self, batches):
        out = real(self, batches)
        if self.state.step == step and out["applied"]:
            with torch.no_grad():
                self.model.src_embed.weight[5, 0] = math.nan
        return out

    monkeypatch.setattr(Trainer, "train_step", poisoning)


def test_a_run_that_diverges_later_keeps_its_last_good_checkpoint(tmp_path, monkeypatch):
    run(tmp_path / "run", "trainer.max_steps=10", "trainer.resume=auto")
    good = tmp_path / "run" / "checkpoints" / "step_10"
    before = (good / "model.safetensors").read_bytes()
    poison_weights_after(monkeypatch, 12)
    with pytest.raises(TrainingDiverged, match=f"after update 12: the loss is nan .* {good}, is kept"):
        run(tmp_path / "run", "trainer.max_steps=20", "trainer.resume=auto")
    assert [p.name for p in ckpt.step_checkpoints(tmp_path / "run")] == ["step_10"]
    assert (good / "model.safetensors").read_bytes() == before
    monkeypatch.undo()
    trainer = run(tmp_path / "run", "trainer.max_steps=12", "trainer.resume=auto")  # resumes from it
    assert trainer.state.step == 12


def test_the_advice_of_the_divergence_message_followed_literally_recovers(tmp_path):
    """At lr 50 the loss explodes (1e4 and more, still finite): the run stops before its
    first checkpoint, and `trainer.resume=auto` with a lower `optim.lr`, as the message and
    docs/errors.md say, completes (a checkpoint of exploded weights diverged again)."""
    with pytest.raises(TrainingDiverged) as e:
        run(tmp_path / "run", "optim.lr=50", "trainer.max_steps=30")
    assert "the loss is" in str(e.value) and "times a uniform guess's (ln 300" in str(e.value)
    assert "lower optim.lr (now 50)" in str(e.value) and "no checkpoint was written" in str(e.value)
    trainer = run(tmp_path / "run", "optim.lr=1e-3", "trainer.max_steps=30", "trainer.resume=auto")
    assert trainer.state.step == 30 and trainer.state.skipped_steps == 0
    assert [p.name for p in ckpt.step_checkpoints(tmp_path / "run")][-1] == "step_30"


def test_a_resume_from_a_good_checkpoint_with_a_lower_lr_applies_it(tmp_path):
    """A run diverging after a good checkpoint: resumed with a lower lr, it continues from
    that checkpoint on the new schedule (the restored schedule kept the diverging lr)."""
    run(tmp_path / "run", "trainer.max_steps=10")
    with pytest.raises(TrainingDiverged, match=r"lower optim.lr \(now 1e\+10\).*step_10, is kept"):
        run(tmp_path / "run", "optim.lr=1e10", "trainer.max_steps=30", "trainer.resume=auto")
    trainer = run(tmp_path / "run", "optim.lr=1e-3", "trainer.max_steps=30", "trainer.resume=auto")
    assert trainer.state.step == 30 and trainer.update.peak == 1e-3


def test_weights_that_turn_nonfinite_are_neither_validated_nor_saved(tmp_path, monkeypatch):
    """An applied update can leave inf weights (an infinite step): the save refuses them."""
    poison_weights_after(monkeypatch, 10)  # update 10 is a validation and a save
    with pytest.raises(TrainingDiverged, match=r"at update 10: the weights hold inf or NaN \(src_embed"):
        run(tmp_path / "run", "trainer.max_steps=20")
    assert not ckpt.step_checkpoints(tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints" / "best").exists()


def meter_after(guard: DivergenceGuard, updates: list[tuple[bool, float, float, float | None]]) -> dict:
    """The meter's reading after `updates` (applied, loss_sum, grad_norm, loss scale), the
    guard's count kept on the device as the trainer keeps it."""
    meter = UpdateMeter(torch.device("cpu"))
    for applied, loss, norm, scale in updates:
        ok = torch.tensor(applied)
        metrics = {"loss_sum": torch.tensor(loss), "nll_sum": torch.tensor(loss),
                   "grad_norm": torch.tensor(norm), "applied": ok, "tokens": 1}
        meter.add(metrics, guard.counts(ok, None if scale is None else torch.tensor(scale)))
    return meter.read()


def test_the_guard_counts_only_skips_in_a_row_and_lets_fp16_find_its_scale():
    guard = DivergenceGuard(3, OptimConfig(lr=1e-3), "fp32")
    bad, good = (False, math.nan, math.nan, None), (True, 2.0, 1.0, None)
    guard.check(7, meter_after(guard, [bad, bad, good, bad, bad]))  # an applied update resets the count
    with pytest.raises(TrainingDiverged, match="the loss is nan for 3 updates in a row"):
        guard.check(7, meter_after(guard, [bad, bad, good, bad, bad, bad]))
    with pytest.raises(TrainingDiverged, match="for 3 updates in a row"):  # a streak between two reads
        guard.check(7, meter_after(guard, [bad, bad, bad, good]))
    fp16 = DivergenceGuard(2, OptimConfig(), "fp16")
    overflow = [(False, 3.0, math.inf, 2.0**10)] * 20  # GradScaler halving its scale from 65536: not divergence
    fp16.check(0, meter_after(fp16, [*overflow, (False, 3.0, math.inf, FP16_MIN_SCALE / 2)]))
    with pytest.raises(TrainingDiverged, match=r"gradient norm is inf .* bf16 or fp32"):
        fp16.check(0, meter_after(fp16, [*overflow, *[(False, 3.0, math.inf, FP16_MIN_SCALE / 4)] * 2]))


@pytest.mark.parametrize("override", ["optim.lr=inf", "optim.lr=nan", "optim.label_smoothing=-inf",
                                      "trainer.max_hours=inf", "decode.lenpen=nan"])
def test_nonfinite_float_settings_are_refused_naming_the_key(override):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"^{key}=(inf|nan|-inf): must be a finite number"):
        to_dataclass(TrainConfig, compose_cfg(override))


SLOW_AFTER_SIGNAL = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    from transformer.training.trainer import Trainer
    from helpers import run
    real = Trainer.train_step
    def slow(self, batches):
        out = real(self, batches)
        print("update", self.state.step, flush=True)
        if self.state.step == 7:
            # Hold this update until the test's first signal has landed (so the loop cannot
            # see it first and stop cleanly), then make the rest of the update long.
            while self.stop_signal is None:
                time.sleep(0.01)
            print("waiting", flush=True)
            time.sleep(120)
        return out
    Trainer.train_step = slow
    run({run_dir!r}, "trainer.max_steps=100000", "trainer.val_every=100000", "trainer.save_every=5")
""")


def test_a_second_signal_ends_the_process_at_once_leaving_the_checkpoints(tmp_path):
    code = SLOW_AFTER_SIGNAL.format(tests=str(PROJECT_ROOT / "tests"), run_dir=str(tmp_path / "run"))
    env = {**os.environ, "MT_TEST_DATA_CACHE": str(shared_cache())}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for line in proc.stdout:  # wait until step_5 is saved
            if line.strip() == "update 7":
                break
        before = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
        proc.send_signal(signal.SIGTERM)
        for line in proc.stdout:
            if line.strip() == "waiting":
                break
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert time.monotonic() - start < 30  # not the 120 s the update would take
    assert proc.returncode == 128 + signal.SIGTERM
    assert "SIGTERM: finishing this update, then saving a checkpoint" in err
    assert "second SIGTERM: stopping now without saving" in err
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == before == ["step_5"]
    ckpt.load_model(tmp_path / "run" / "checkpoints" / "step_5")


def test_a_fresh_models_loss_is_not_divergence_even_above_three_ln_v():
    # a vocabulary of 8 and d_model 1024: the tied embeddings make a fresh model's logits
    # far from uniform, its loss above 3 ln 8 = 6.24 at the first update
    from transformer.config import ModelConfig
    from transformer.model.transformer import build_model
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=8, d_model=1024, n_heads=4, d_ff=64, n_encoder_layers=1,
                                    n_decoder_layers=1, dropout=0.0, attn_dropout=0.0, ffn_dropout=0.0))
    gen = torch.Generator().manual_seed(0)
    src, tgt_in, tgt_out = (torch.randint(4, 8, (16, 10), generator=gen) for _ in range(3))
    with torch.no_grad():
        loss_sum = torch.nn.functional.cross_entropy(model(src, tgt_in).flatten(0, 1), tgt_out.flatten(),
                                                     reduction="sum")
    tokens = tgt_out.numel()
    assert loss_sum / tokens > 3 * math.log(8)  # the case this test is about
    guard = DivergenceGuard(5, OptimConfig(), "fp32", vocab_size=8)
    reading = {"loss_sum": loss_sum.item(), "tokens": tokens, "worst_streak": 0.0, "bad_loss": math.nan,
               "bad_grad_norm": math.nan, "first_loss_sum": loss_sum.item(), "first_tokens": tokens}
    guard.check(1, reading)  # the loss the run starts from
    with pytest.raises(TrainingDiverged, match=r"the first update's \(\d"):  # exploded: still refused
        guard.check(2, {**reading, "loss_sum": 1e4 * tokens})
