"""A command's output is written whole or not at all (transformer/atomic_files.py).

A failure inside the write leaves the earlier output whole; the temporary and set-aside
names are chosen free, so no file of the user's is touched; `atomic_write` leaves the
old file or the new one, never half of one and no temporary file.
"""

from __future__ import annotations

import os

import pytest

from transformer import atomic_files
from transformer.outputs import Output


def test_a_failure_while_writing_leaves_the_earlier_output_whole(tmp_path):
    out = Output.of(tmp_path / "out.en", "output", "mt-translate", force=True)
    atomic_files.write_text(out, "first\n")
    with pytest.raises(RuntimeError, match="crash"), atomic_files.write_file(out) as tmp:
        tmp.write_text("half")
        raise RuntimeError("crash")
    assert (tmp_path / "out.en").read_text() == "first\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".mt-outputs.json", "out.en"]
    folder = Output.of(tmp_path / "avg", "-o", "mt-average", is_dir=True, force=True)
    with atomic_files.write_dir(folder) as tmp:
        tmp.mkdir()
        (tmp / "a").write_text("first")
    with pytest.raises(RuntimeError, match="crash"), atomic_files.write_dir(folder) as tmp:
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
              tmp_path / f"avg.tmp-{pid}": "c", tmp_path / f"avg.old-{pid}": "d"}
    for path, text in theirs.items():
        path.write_text(text)
    for text in ("first\n", "second\n"):  # the second replaces the first: a set-aside name too
        atomic_files.write_text(out, text)
        with atomic_files.write_dir(folder) as tmp:
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
