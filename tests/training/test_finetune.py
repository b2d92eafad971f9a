"""Fine-tuning (`trainer.init_from`): a new run from a checkpoint's weights, model config
and tokenizer, with a fresh optimizer and schedule, that resumes as itself."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer import checkpoint as ckpt
from transformer.config import ConfigError, ModelConfig
from transformer.data.corpus import read_lines
from transformer.training.finetune import command_line_model_keys, model_from_parent
from transformer.training.trainer import Trainer

from helpers import DEBUG, SAMPLE, renamed_piece, run, shared_cache


@pytest.fixture(scope="module")
def parent(tmp_path_factory) -> Path:
    """The last checkpoint of a 20-update debug run on data/sample."""
    run_dir = tmp_path_factory.mktemp("parent") / "run"
    run(run_dir)
    return run_dir / "checkpoints" / "step_20"


@pytest.fixture
def first_step(monkeypatch) -> list[dict]:
    """What the trainer holds when its first update of this invocation begins."""
    seen: list[dict] = []
    real = Trainer.train_step

    def recording(self, batches):
        if not seen:
            seen.append({"weights": {k: v.clone() for k, v in self.model.state_dict().items()},
                         "optimizer_state": dict(self.optimizer.state), "step": self.state.step,
                         "scheduler_epoch": self.scheduler.last_epoch, "lr": self.scheduler.get_last_lr()[0],
                         "tokenizer": self.tokenizer.proto, "train": self.data.train})
        return real(self, batches)

    monkeypatch.setattr(Trainer, "train_step", recording)
    return seen


def files_overrides(tmp_path: Path) -> list[str]:
    """New data: the sample's dev pairs, reversed, as a plain-text pair (data=files)."""
    src, tgt = read_lines(SAMPLE / "train.it")[::-1][:200], read_lines(SAMPLE / "train.en")[::-1][:200]
    (tmp_path / "new.it").write_text("".join(s + "\n" for s in src))
    (tmp_path / "new.en").write_text("".join(t + "\n" for t in tgt))
    return ["data=files", f"data.train_src={tmp_path / 'new.it'}", f"data.train_tgt={tmp_path / 'new.en'}"]


def test_a_finetuning_run_starts_from_the_weights_with_a_fresh_optimizer(parent, tmp_path, first_step):
    trainer = run(tmp_path / "ft", f"trainer.init_from={parent}", "trainer.max_steps=4",
                  "optim.warmup_steps=4", "optim.lr=5e-4", *files_overrides(tmp_path))
    start = first_step[0]
    parent_model, parent_tok = ckpt.load_model(parent)
    for k, v in parent_model.state_dict().items():  # step 0: exactly the parent's weights
        assert torch.equal(start["weights"][k], v), k
    assert start["optimizer_state"] == {} and start["step"] == 0 and start["scheduler_epoch"] == 0
    assert start["lr"] == pytest.approx(5e-4 / 4)  # its own peak lr, warm-up from its step 0
    # the parent's tokenizer byte for byte, and the new data encoded with it
    assert start["tokenizer"] == parent_tok.proto == (parent / "tokenizer.model").read_bytes()
    row = start["train"][0]
    assert row["src_ids"] == parent_tok.encode([row["src"]])[0]
    assert trainer.model.cfg == parent_model.cfg
    saved = tmp_path / "ft" / "checkpoints" / "step_4"
    assert (saved / "tokenizer.model").read_bytes() == parent_tok.proto
    assert json.loads((saved / "meta.json").read_text())["init_from"] == str(parent)
    assert trainer.state.step == 4


def test_a_stopped_finetuning_run_resumes_as_itself(parent, tmp_path, first_step):
    run(tmp_path / "ft", f"trainer.init_from={parent}", "trainer.max_steps=4", "trainer.val_every=4")
    own = ckpt.load_model(tmp_path / "ft" / "checkpoints" / "step_4")[0].state_dict()
    first_step.clear()
    trainer = run(tmp_path / "ft", f"trainer.init_from={parent}", "trainer.max_steps=6",
                  "trainer.val_every=4", "trainer.resume=auto")
    start = first_step[0]
    assert start["step"] == 4 and start["optimizer_state"]  # its own optimizer, not a fresh one
    for k, v in own.items():
        assert torch.equal(start["weights"][k], v), k  # its own step_4, never the parent
    assert trainer.state.step == 6


def test_refusals_are_one_line_and_leave_nothing(parent, tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    (export / "export.json").write_text("{}")
    empty = tmp_path / "empty"
    empty.mkdir()
    changed = tmp_path / "changed"
    shutil.copytree(parent, changed)
    (changed / "tokenizer.model").write_bytes(renamed_piece((parent / "tokenizer.model").read_bytes())[0])
    cases = [
        ([f"trainer.init_from={changed}"], f"{changed}/tokenizer.model is not the tokenizer this checkpoint was written "
                                           "with"),
        ([f"trainer.init_from={export}"], "is a CTranslate2 export (mt-export), not a training checkpoint"),
        ([f"trainer.init_from={empty}"], f"checkpoint {empty} is missing model.json"),
        ([f"trainer.init_from={tmp_path / 'nowhere'}"], "no checkpoint directory at"),
        ([f"trainer.init_from={parent}", f"trainer.resume={parent}"], "both say where the weights come from"),
        ([f"trainer.init_from={parent}", f"data.tokenizer={parent}"],
         "encodes its data with the checkpoint's own tokenizer; drop data.tokenizer"),
        ([f"trainer.init_from={parent}", "model.d_model=64"],
         "model.d_model=64: trainer.init_from=" + str(parent) + " takes the model from the checkpoint (model.d_model=32)"),
        ([f"trainer.init_from={parent}", "model=small"], "model=small: trainer.init_from takes the model"),
    ]
    for args, message in cases:
        proc = subprocess.run(
            [sys.executable, "-m", "transformer.commands.train", *DEBUG, *args, f"trainer.run_dir={tmp_path / 'ft'}",
             f"data.cache_dir={shared_cache()}"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        last = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode == 1 and last.startswith("mt-train: error: ") and message in last, (args, last)
        assert not (tmp_path / "ft").exists()


def test_the_command_lines_model_settings_are_found_and_a_model_group_refused():
    assert command_line_model_keys(["trainer.max_steps=3", "model.dropout=0.3", "++model.ffn_dropout=0"]) == [
        "dropout", "ffn_dropout"]
    with pytest.raises(ConfigError, match=r"model=base: trainer\.init_from takes the model"):
        command_line_model_keys(["model=base"])


def test_model_from_parent_keeps_the_architecture(parent):
    saved = ckpt.load_model_config(parent)
    assert model_from_parent(parent, {"dropout": 0.3}) == ModelConfig(**{**saved.__dict__, "dropout": 0.3})
    assert model_from_parent(parent, {"n_heads": saved.n_heads}) == saved  # the same value is no conflict
    with pytest.raises(ConfigError, match=r"model\.n_encoder_layers=6: .* only model\.dropout"):
        model_from_parent(parent, {"n_encoder_layers": 6})
