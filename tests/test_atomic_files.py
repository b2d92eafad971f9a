"""One mechanism writes a file or a folder whole or not at all (transformer/atomic_files.py),
and the commands' outputs, the checkpoints and the prepared-data cache all go through it.

A failure inside the write leaves the earlier output whole; the temporary and set-aside
names are chosen free, so no file of the user's is touched; a failed final rename puts
back what was set aside; `atomic_write` leaves the old file or the new one, never half of
one and no temporary file; what is written follows the user's umask.
"""

from __future__ import annotations

import ast
import os
import stat

import pytest
import torch

from transformer import atomic_files, checkpoint, outputs
from transformer.config import DataConfig, ModelConfig
from transformer.data import pipeline
from transformer.model.transformer import build_model
from transformer.outputs import Output
from transformer.paths import PROJECT_ROOT

from helpers import sample_tokenizer


def test_a_failure_while_writing_leaves_the_earlier_output_whole(tmp_path):
    out = Output.of(tmp_path / "out.en", "output", "mt-translate", force=True)
    outputs.write_text(out, "first\n")
    with pytest.raises(RuntimeError, match="crash"), outputs.write_file(out) as tmp:
        tmp.write_text("half")
        raise RuntimeError("crash")
    assert (tmp_path / "out.en").read_text() == "first\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".mt-outputs.json", "out.en"]
    folder = Output.of(tmp_path / "avg", "-o", "mt-average", is_dir=True, force=True)
    with outputs.write_dir(folder) as tmp:
        tmp.mkdir()
        (tmp / "a").write_text("first")
    with pytest.raises(RuntimeError, match="crash"), outputs.write_dir(folder) as tmp:
        tmp.mkdir()
        (tmp / "a").write_text("second")
        raise RuntimeError("crash")
    assert (tmp_path / "avg" / "a").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".mt-outputs.json", "avg", "out.en"]


def test_a_users_files_named_like_the_temporary_siblings_survive_a_write(tmp_path):
    """The temporary and set-aside names (`NAME.tmp-PID`, `NAME.old-PID`) are chosen free:
    a file of the user's that happens to bear one is never removed or replaced."""
    pid = os.getpid()
    out = Output.of(tmp_path / "out.en", "output", "mt-translate", force=True)
    folder = Output.of(tmp_path / "avg", "-o", "mt-average", is_dir=True, force=True)
    theirs = {tmp_path / f".out.tmp-{pid}.en": "a", tmp_path / f"out.en.old-{pid}": "b",
              tmp_path / f"avg.tmp-{pid}": "c", tmp_path / f"avg.old-{pid}": "d",
              tmp_path / f"..mt-outputs.json.tmp-{pid}": "e"}
    for path, text in theirs.items():
        path.write_text(text)
    for text in ("first\n", "second\n"):  # the second replaces the first: a set-aside name too
        outputs.write_text(out, text)
        with outputs.write_dir(folder) as tmp:
            tmp.mkdir()
            (tmp / "w.txt").write_text(text)
    assert (tmp_path / "out.en").read_text() == "second\n"
    assert (tmp_path / "avg" / "w.txt").read_text() == "second\n"
    assert {p: p.read_text() for p in theirs} == theirs


def test_atomic_write_leaves_the_new_file_or_the_old_one_and_nothing_else(tmp_path, monkeypatch):
    path = tmp_path / "deep" / "notes.json"
    atomic_files.atomic_write(path, b"first")
    atomic_files.atomic_write(path, b"second")
    assert path.read_bytes() == b"second"

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)  # the rename into place fails
    with pytest.raises(OSError, match="No space"):
        atomic_files.atomic_write(path, b"third")
    assert path.read_bytes() == b"second"
    assert sorted(p.name for p in path.parent.iterdir()) == ["notes.json"]


def test_a_failed_rename_of_a_folder_puts_back_the_one_set_aside(tmp_path, monkeypatch):
    """Between the two renames of a folder's swap the old copy is aside: a failure of the
    second puts it back, so the path is never left missing."""
    target = tmp_path / "folder"
    target.mkdir()
    (target / "a").write_text("first")
    rename = type(target).rename

    def second_rename_fails(self, to):
        if self.name.startswith("folder.tmp-"):
            raise OSError(28, "No space left on device")
        return rename(self, to)

    monkeypatch.setattr(type(target), "rename", second_rename_fails)
    with pytest.raises(OSError, match="No space"), atomic_files.put_in_place(target) as tmp:
        tmp.mkdir()
        (tmp / "a").write_text("second")
    assert (target / "a").read_text() == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["folder"]


def test_replace_may_keep_what_another_writer_completed_first(tmp_path):
    """The cache's rule: a complete folder found at the swap is kept and the new copy
    dropped; a half-made one is replaced."""
    target = tmp_path / "prepared-x"
    complete = lambda found: not (found / "meta.json").exists()  # noqa: E731
    target.mkdir()
    (target / "meta.json").write_text("theirs")
    with atomic_files.put_in_place(target, replace=complete) as tmp:
        tmp.mkdir()
        (tmp / "meta.json").write_text("ours")
    assert (target / "meta.json").read_text() == "theirs"
    (target / "meta.json").unlink()  # half-made: replaced
    with atomic_files.put_in_place(target, replace=complete) as tmp:
        tmp.mkdir()
        (tmp / "meta.json").write_text("ours")
    assert (target / "meta.json").read_text() == "ours"
    assert [p.name for p in tmp_path.iterdir()] == ["prepared-x"]


def wrong_modes(folder, mask: int) -> dict[str, str]:
    """What under `folder` has another mode than `open`/`mkdir` give under `mask`."""
    return {p.relative_to(folder).as_posix(): oct(stat.S_IMODE(p.stat().st_mode)) for p in folder.rglob("*")
            if stat.S_IMODE(p.stat().st_mode) != (0o777 if p.is_dir() else 0o666) & ~mask}


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_checkpoints_and_the_cache_follow_the_umask(tmp_path, mask):
    """No file or folder of a checkpoint, an output or the prepared-data cache is made
    owner-only when the umask lets the group (or others) read: a serving account can read
    what training wrote. (safetensors writes owner-only through a temporary file.)"""
    before = os.umask(mask)
    try:
        tokenizer = sample_tokenizer()
        model = build_model(ModelConfig(vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, d_ff=32,
                                        n_encoder_layers=1, n_decoder_layers=1, max_positions=32))
        checkpoint.save_checkpoint(tmp_path / "ckpt" / "step_1", model, tokenizer, "", {},
                                   {"x": torch.zeros(1)}, also=tmp_path / "ckpt" / "best")
        cfg = DataConfig(name="sample", cache_dir=str(tmp_path / "cache"), spm_vocab_size=120,
                                  num_proc=1)
        pipeline.prepare_data(cfg)
        outputs.write_text(Output.of(tmp_path / "out" / "hyp.en", "output", "mt-translate"), "x\n")
    finally:
        os.umask(before)
    assert (tmp_path / "ckpt" / "best" / "model.safetensors").is_file()
    assert list((tmp_path / "cache").glob("spm-*.model")) and list((tmp_path / "cache").glob("source-*"))
    assert wrong_modes(tmp_path, mask) == {}


def test_the_mechanism_knows_nothing_of_the_rules_that_use_it():
    """atomic_files imports no module of the package (not even for type checking): the
    output rules (outputs.py) import it, never the other way round."""
    tree = ast.parse((PROJECT_ROOT / "transformer" / "atomic_files.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | \
        {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m.startswith("transformer")}
