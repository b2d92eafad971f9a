"""A full disk (or another I/O error) while writing is one line naming the path, from every
writer, whichever library meets it, and nothing half written is left behind (#51.3).

Each writer is made to fail as a full disk makes it fail: the library call writes part of
its file, then raises what that library raises (an OSError for Python's own files,
safetensors' SafetensorError, torch.save's RuntimeError). `errors.writing` is the one
guard they all run in. Checked by hand on a 200 KiB tmpfs too (docs/errors.md).
"""

from __future__ import annotations

import errno
import sys
from pathlib import Path

import pyarrow as pa
import pytest
import torch
from safetensors import SafetensorError

from transformer import checkpoint
from transformer.commands import average, prepare, translate
from transformer.errors import UserFileError, writing

from helpers import tiny_checkpoint

ENOSPC = OSError(errno.ENOSPC, "No space left on device")


def _full(path, *_a, **_k):
    with open(path, "wb") as f:  # what a full disk leaves: part of the file
        f.write(b"half")
    raise ENOSPC


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def refused(monkeypatch, main, *argv: str) -> str:
    monkeypatch.setattr(sys, "argv", list(argv))
    with pytest.raises(SystemExit) as e:
        main()
    line = e.value.code
    assert isinstance(line, str) and line.startswith(f"{argv[0]}: error: ") and "\n" not in line, line
    return line


@pytest.mark.parametrize("err", [
    ENOSPC,
    SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
    SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "x" })'),
])
def test_a_writers_io_error_is_one_line_naming_the_path(err):
    with pytest.raises(UserFileError) as e, writing("out/avg", "-o"):
        raise err
    assert str(e.value) == "-o out/avg: cannot write it (No space left on device)"


def test_torch_saves_failed_write_is_named_and_a_bug_keeps_its_traceback():
    with pytest.raises(UserFileError, match=r"^ckpt: cannot write it \(the write failed: is the disk full\?\)$"), \
            writing("ckpt"):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    for bug in (RuntimeError("size mismatch"), ValueError("bad"), SafetensorError("not contiguous")):
        with pytest.raises(type(bug)), writing("ckpt"):
            raise bug


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    tiny_checkpoint(tmp_path / "a")
    tiny_checkpoint(tmp_path / "b", seed=1)
    (tmp_path / "in.it").write_text("Ciao, come stai?\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_mt_average_on_a_full_disk(home, monkeypatch):
    """safetensors' error was a traceback (SafetensorError ... No space left on device)."""
    def full(model, path, *a, **k):
        with open(path, "wb") as f:
            f.write(b"half")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(checkpoint, "save_safetensors", full)
    before = snapshot(home)
    line = refused(monkeypatch, average.main, "mt-average", "a", "b", "-o", "avg")
    assert line == "mt-average: error: -o avg: cannot write it (No space left on device)"
    assert snapshot(home) == before and not (home / "avg").exists()


def test_a_checkpoint_save_on_a_full_disk_keeps_the_previous_copy(home, monkeypatch):
    before = snapshot(home)
    model, tokenizer = checkpoint.load_model(home / "a")
    monkeypatch.setattr(torch, "save", lambda obj, f, *a, **k: _full(f))
    with pytest.raises(UserFileError, match=r"a: cannot write it \(No space left on device\)$"):
        checkpoint.save_checkpoint(home / "a", model, tokenizer, "", {}, trainer_state={"x": 1})
    assert snapshot(home) == before


def test_mt_translate_on_a_full_disk(home, monkeypatch):
    monkeypatch.setattr(Path, "write_bytes", lambda self, *a, **k: _full(self))  # the marker's write
    before = snapshot(home)
    line = refused(monkeypatch, translate.main, "mt-translate", "checkpoint=a", "input.file=in.it",
                   "output=out.en", "decode=greedy", "progress=false")
    assert line == "mt-translate: error: output=out.en: cannot write it (No space left on device)"
    assert snapshot(home) == before


def test_mt_prepare_on_a_full_disk(home, monkeypatch):
    monkeypatch.setattr(pa, "OSFile", lambda path, mode: _full(path))
    cache = home / "cache"
    line = refused(monkeypatch, prepare.main, "mt-prepare", "data=sample", f"data.cache_dir={cache}")
    assert line == (f"mt-prepare: error: data.cache_dir={cache}: cannot write the prepared data in "
                    "it (No space left on device)")
    assert not any(p.is_file() for p in cache.rglob("*"))  # nothing half written


def test_mt_export_on_a_full_disk(home, monkeypatch):
    pytest.importorskip("ctranslate2")
    from transformer.commands import export

    monkeypatch.setattr(Path, "write_bytes", lambda self, *a, **k: _full(self))
    before = snapshot(home)
    line = refused(monkeypatch, export.main, "mt-export", "checkpoint=a", "output=ex")
    assert line == "mt-export: error: output=ex: cannot write it (No space left on device)"
    assert snapshot(home) == before and not (home / "ex").exists()

