"""Checkpoints written before a ModelConfig key was renamed still load; a missing or
corrupt checkpoint is a clear error naming the file."""

from __future__ import annotations

import json

import pytest
import torch

from transformer import checkpoint as ckpt
from transformer.checkpoint import load_model, load_model_config, save_checkpoint
from transformer.config import ModelConfig
from transformer.data.corpus import read_lines
from transformer.data.tokenizer import train_tokenizer
from transformer.model.transformer import build_model
from transformer.paths import PROJECT_ROOT

from helpers import run

SAMPLE = PROJECT_ROOT / "data" / "sample"


def test_a_model_json_with_the_old_max_len_key_loads(tmp_path):
    tokenizer = train_tokenizer(read_lines(SAMPLE / "train.it") + read_lines(SAMPLE / "train.en"), vocab_size=200)
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=200, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1,
                                    n_decoder_layers=1, max_positions=40))
    path = save_checkpoint(tmp_path / "old", model, tokenizer, "", {})
    saved = json.loads((path / "model.json").read_text())
    saved["max_len"] = saved.pop("max_positions")  # as written before the rename
    (path / "model.json").write_text(json.dumps(saved))
    assert load_model_config(path).max_positions == 40
    loaded, _ = load_model(path)
    for k, v in model.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k


def test_missing_and_corrupt_checkpoints_are_clear_errors(tmp_path):
    with pytest.raises(ckpt.CheckpointError, match="no checkpoint directory"):
        ckpt.load_model(tmp_path / "nowhere")
    run(tmp_path / "run", "trainer.max_steps=2")
    path = ckpt.step_checkpoints(tmp_path / "run")[-1]
    (path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ckpt.CheckpointError, match=r"model\.safetensors"):
        ckpt.load_model(path)
    (path / "trainer_state.pt").write_bytes(b"garbage")
    with pytest.raises(ckpt.CheckpointError, match=r"trainer_state\.pt"):
        ckpt.load_trainer_state(path)
