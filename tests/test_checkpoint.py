"""Checkpoints written before a ModelConfig key was renamed still load; a missing or
corrupt checkpoint is a clear error naming the file; a second checkpoint of the same
weights (`also`) is hard links (copies without them), in place before the first, and a
failed write leaves both previous ones; a tokenizer changed after the checkpoint was
written is refused by every loader."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from transformer import checkpoint as ckpt
from transformer.checkpoint import load_model, load_model_config, save_checkpoint
from transformer.commands import translate
from transformer.config import ModelConfig
from transformer.data.corpus import read_lines
from transformer.data.tokenizer import Tokenizer, train_tokenizer
from transformer.decoding.translator import Translator
from transformer.errors import UserFileError
from transformer.model.transformer import build_model
from transformer.paths import PROJECT_ROOT

from helpers import renamed_piece, run, sample_tokenizer

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


def tiny(seed: int):
    tokenizer = sample_tokenizer()
    torch.manual_seed(seed)
    return build_model(ModelConfig(vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, d_ff=32,
                                   n_encoder_layers=1, n_decoder_layers=1, max_positions=32)), tokenizer


def test_also_is_the_same_files_but_the_trainer_state_as_hard_links(tmp_path, monkeypatch):
    renamed, rename = [], Path.rename
    monkeypatch.setattr(Path, "rename", lambda self, target: renamed.append(Path(target).name) or rename(self, target))
    model, tok = tiny(0)
    step = save_checkpoint(tmp_path / "step_1", model, tok, "a: 1\n", {"step": 1}, {"x": torch.ones(2)},
                           also=tmp_path / "best")
    best = tmp_path / "best"
    assert sorted(p.name for p in best.iterdir()) == sorted(p.name for p in step.iterdir() if p.name != ckpt.STATE)
    assert all(f.samefile(step / f.name) for f in best.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best", "step_1"]  # no leftovers
    assert renamed == ["best", "step_1"]  # `also` in place first (a crash between: `best` newer)
    shutil.rmtree(step)  # a pruned step_N: its `best` is whole
    loaded, _ = load_model(best)
    for k, v in model.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k


def test_also_is_copied_where_the_filesystem_has_no_hard_links(tmp_path, monkeypatch):
    def no_links(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    model, tok = tiny(0)
    step = save_checkpoint(tmp_path / "step_1", model, tok, "", {"step": 1}, {"x": 1}, also=tmp_path / "best")
    for f in (tmp_path / "best").iterdir():
        assert not f.samefile(step / f.name) and f.read_bytes() == (step / f.name).read_bytes(), f.name


@pytest.mark.parametrize("where", ["trainer state", "also"])
def test_a_failed_write_leaves_the_previous_checkpoint_and_also(tmp_path, monkeypatch, where):
    """A full disk while the new step checkpoint's trainer state is written, or while its
    `best` is linked (copied): the previous `step_2` and `best` are as they were."""
    model, tok = tiny(0)
    save_checkpoint(tmp_path / "step_2", model, tok, "", {"step": 2}, {"x": 1}, also=tmp_path / "best")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    if where == "trainer state":
        monkeypatch.setattr(torch, "save", full)
    else:
        monkeypatch.setattr(os, "link", full)
        monkeypatch.setattr(shutil, "copy2", full)
    newer, _ = tiny(1)
    with pytest.raises(UserFileError, match="No space left"):
        save_checkpoint(tmp_path / "step_2", newer, tok, "", {"step": 3}, {"x": 1}, also=tmp_path / "best")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best", "step_2"]  # no leftovers
    for name in ("step_2", "best"):
        assert ckpt.load_meta(tmp_path / name)["step"] == 2
        loaded, _ = load_model(tmp_path / name)
        for k, v in model.state_dict().items():
            assert torch.equal(v, loaded.state_dict()[k]), (name, k)


def test_a_tokenizer_changed_after_the_checkpoint_was_written_is_refused(tmp_path, monkeypatch):
    """A renamed piece still parses, and every id of it would decode as the new piece: the
    SHA-256 meta.json records is checked by load_model, Translator.load and mt-translate,
    each in one line naming the file."""
    model, tok = tiny(0)
    path = save_checkpoint(tmp_path / "best", model, tok, "", {"step": 1})
    assert ckpt.load_meta(path)["tokenizer_sha256"] == hashlib.sha256(tok.proto).hexdigest()
    load_model(path)  # as written: loads
    changed, old, new = renamed_piece(tok.proto)
    assert Tokenizer.from_proto(changed).id_to_piece(tok.piece_ids([old])[0]) == new  # silently another piece
    (path / "tokenizer.model").write_bytes(changed)
    refusal = rf"^{path}/tokenizer\.model is not the tokenizer this checkpoint was written with \(its SHA-256"
    with pytest.raises(ckpt.CheckpointError, match=refusal):
        load_model(path)
    with pytest.raises(ckpt.CheckpointError, match=refusal):
        Translator.load(path)
    (tmp_path / "in.it").write_text("Ciao\n")
    monkeypatch.setattr(sys, "argv", ["mt-translate", f"checkpoint={path}", f"input.file={tmp_path / 'in.it'}"])
    with pytest.raises(SystemExit) as e:
        translate.main()
    assert isinstance(e.value.code, str) and "\n" not in e.value.code
    assert e.value.code.startswith(f"mt-translate: error: {path}/tokenizer.model is not the tokenizer")


# -- checkpoint=RUN_DIR -------------------------------------------------------------------

def _run_dir(root: Path, *names: str) -> Path:
    """A run directory whose checkpoints folder holds `names`, each with a meta.json."""
    for name in names:
        folder = root / "checkpoints" / name
        folder.mkdir(parents=True)
        step = int(name.split("_")[1]) if name.startswith("step_") else 20
        (folder / ckpt.META).write_text(json.dumps({"step": step}))
        (folder / ckpt.MODEL_CFG).write_text("{}")
    return root


def test_a_run_directory_names_its_best_checkpoint_else_its_newest_and_says_which(tmp_path, caplog):
    run_dir = _run_dir(tmp_path / "run", "step_10", "step_20", "best")
    with caplog.at_level("INFO"):
        assert ckpt.find_checkpoint(run_dir) == run_dir / "checkpoints" / "best"
        assert ckpt.find_checkpoint(run_dir / "checkpoints") == run_dir / "checkpoints" / "best"
    assert f"its best checkpoint, {run_dir / 'checkpoints' / 'best'} (step 20)" in caplog.text
    caplog.clear()
    early = _run_dir(tmp_path / "early", "step_5", "step_10", "step_9")  # no validation yet
    with caplog.at_level("INFO"):
        assert ckpt.find_checkpoint(str(early), key="checkpoint") == early / "checkpoints" / "step_10"
    assert "no best yet (no validation has run), so its newest" in caplog.text
    assert "(step 10)" in caplog.text


def test_a_checkpoint_or_an_export_is_taken_as_it_is(tmp_path):
    run_dir = _run_dir(tmp_path / "run", "step_10")
    step = run_dir / "checkpoints" / "step_10"
    assert ckpt.find_checkpoint(step) == step
    export = tmp_path / "export"
    export.mkdir()
    (export / "export.json").write_text("{}")
    assert ckpt.find_checkpoint(export) == export  # the loader checks what it is


def test_a_missing_checkpoints_error_lists_those_that_exist(tmp_path):
    run_dir = _run_dir(tmp_path / "run", "step_10", "step_20")
    with pytest.raises(ckpt.CheckpointError) as e:
        ckpt.find_checkpoint(run_dir / "checkpoints" / "best")
    message = str(e.value)
    assert message.startswith(f"checkpoint={run_dir / 'checkpoints' / 'best'}: no such directory; ")
    assert "holds step_10, step_20 (best is written at the run's first validation" in message
    assert "\n" not in message
    with pytest.raises(ckpt.CheckpointError, match=r"holds step_10, step_20"):
        ckpt.find_checkpoint(run_dir / "best", key="trainer.init_from")  # checkpoints/ left out
    with pytest.raises(ckpt.CheckpointError, match=r"^checkpoint=.*nowhere: no such directory$"):
        ckpt.find_checkpoint(tmp_path / "nowhere")
    (run_dir / "checkpoints" / "step_30.tmp-1").mkdir()  # an unfinished write is no checkpoint
    with pytest.raises(ckpt.CheckpointError, match="holds step_10, step_20 "):
        ckpt.find_checkpoint(run_dir / "checkpoints" / "best")


def test_a_run_directory_without_a_checkpoint_is_refused(tmp_path):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(ckpt.CheckpointError, match="a run directory without a complete checkpoint yet"):
        ckpt.find_checkpoint(tmp_path / "run")
