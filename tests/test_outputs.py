"""Nothing a user owns is ever overwritten (transformer/outputs.py, docs/errors.md).

The cases of a bad-input probe of the commands, each run as a user would type it, in a
directory holding a run (`runs/x`: step_10, step_20, best, train.log, config.yaml, tb/),
an export of it (`EX`, where CTranslate2 is installed), a user's folder and files. Each
refused case ends with one line and status 1 before any work; after every case, every
file the user had is byte-identical.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from transformer import outputs
from transformer.commands import average, evaluate, prepare, train, translate
from transformer.commands import masks as masks_cli
from transformer.errors import ConfigError, UserError
from transformer.outputs import Output, OutputError

from helpers import SAMPLE, tiny_checkpoint

CK = "runs/x/checkpoints/best"


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("probe")
    run = root / "runs" / "x"
    for seed, name in enumerate(("step_10", "step_20", "best")):
        tiny_checkpoint(run / "checkpoints" / name, seed=seed)
    (run / "train.log").write_text("a log\n")
    (run / "config.yaml").write_text("trainer: {}\n")
    (run / "tb").mkdir()
    (run / "tb" / "events.out").write_bytes(b"events")
    (root / "userdir").mkdir()
    (root / "userdir" / "f.txt").write_text("the user's file\n")
    (root / "notes.txt").write_text("the user's notes\n")
    (root / "in.it").write_text("Ciao, come stai?\nChe ore sono?\n")
    try:
        import ctranslate2  # noqa: F401

        from transformer.commands.export import export
        from transformer.deploy.ct2_export import ExportConfig

        export(ExportConfig(checkpoint=str(run / "checkpoints" / "best"), output=str(root / "EX"),
                            quantization="int8"))
    except ImportError:  # no export extra: the export cases skip
        pass
    return root


@pytest.fixture
def home(template, tmp_path, monkeypatch) -> Path:
    """A fresh copy of the template as the working directory."""
    root = tmp_path / "home"
    shutil.copytree(template, root)
    monkeypatch.chdir(root)
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def refused(monkeypatch, main, *argv: str) -> str:
    """Run a console script; it must exit with one line `prog: error: ...` (status 1)."""
    monkeypatch.setattr(sys, "argv", list(argv))
    with pytest.raises(SystemExit) as e:
        main()
    line = e.value.code
    assert isinstance(line, str), f"exit status {line!r}, not a one-line error"
    assert line.startswith(f"{argv[0]}: error: ") and "\n" not in line, line
    return line


def ran(monkeypatch, main, *argv: str) -> None:
    monkeypatch.setattr(sys, "argv", list(argv))
    main()


# --- mt-average -----------------------------------------------------------------------

C = "runs/x/checkpoints"
AVERAGE_REFUSED = [
    ([f"{C}/step_10", f"{C}/step_20", "-o", "userdir"], "-o userdir: exists and is not an output of mt-average"),
    ([f"{C}/step_10", f"{C}/step_20", "-o", f"{C}/best"], "is not an output of mt-average"),
    ([f"{C}/step_10", f"{C}/step_20", "-o", "runs/x"], "-o runs/x: is a run directory"),
    (["runs/x", "--last", "2", "-o", C], f"-o {C}: is a run's checkpoints folder"),
    ([f"{C}/step_10", f"{C}/step_20", "-o", "notes.txt"], "-o notes.txt: exists and is not a directory"),
    ([f"{C}/step_10", f"{C}/step_20", "-o", f"{C}/step_20"], "is an input of this command"),
    ([f"{C}/step_10", f"{C}/step_20", "-o", "notes.txt/avg"], "notes.txt is a file, not a folder"),
    ([f"{C}/step_10", f"{C}/step_20", "-o", f"{C}/step_20/avg"], "is inside an input"),
]


@pytest.mark.parametrize(("args", "why"), AVERAGE_REFUSED, ids=[" ".join(a[-2:]) for a, _ in AVERAGE_REFUSED])
def test_mt_average_refuses_an_output_it_did_not_write(home, monkeypatch, args, why):
    before = snapshot(home)
    line = refused(monkeypatch, average.main, "mt-average", *args)
    assert why in line
    assert snapshot(home) == before


def test_mt_average_into_an_export_is_refused(home, monkeypatch):
    if not (home / "EX").is_dir():
        pytest.skip("no CTranslate2: no export")
    before = snapshot(home)
    line = refused(monkeypatch, average.main, "mt-average", f"{C}/step_10", f"{C}/step_20", "-o", "EX", "--force")
    assert "-o EX: exists and is not an output of mt-average" in line and "even with --force" in line
    assert snapshot(home) == before


def test_mt_average_replaces_only_its_own_output_and_only_with_force(home, monkeypatch):
    args = ("mt-average", f"{C}/step_10", f"{C}/step_20", "-o", f"{C}/avg")
    before = snapshot(home)
    ran(monkeypatch, average.main, *args)
    marker = json.loads((home / C / "avg" / outputs.DIR_MARKER).read_text())
    assert marker["command"] == "mt-average" and "model.safetensors" in marker["files"]
    first = snapshot(home)
    assert {k: v for k, v in first.items() if k in before} == before  # only new files
    assert "exists (an earlier output of mt-average): add --force" in refused(monkeypatch, average.main, *args)
    ran(monkeypatch, average.main, *args, "--force")
    (home / C / "avg" / "mine.txt").write_text("a user's file put into the average")
    assert "holds files mt-average did not write (mine.txt)" in refused(monkeypatch, average.main, *args, "--force")
    assert (home / C / "avg" / "mine.txt").is_file()
    assert sorted(p.name for p in (home / C).iterdir()) == ["avg", "best", "step_10", "step_20"]  # no leftovers


# A marker licenses only the files it lists: one that lists nothing (written by someone
# else: every marker the commands ever wrote lists its files) licenses nothing.
FOREIGN_MARKERS = [{"command": "mt-average"}, {"command": "mt-average", "files": []},
                   {"command": "mt-average", "files": "f.txt"}, {"command": "mt-average", "files": [1]}]


@pytest.mark.parametrize("marker", FOREIGN_MARKERS, ids=[json.dumps(m) for m in FOREIGN_MARKERS])
def test_a_marker_that_lists_nothing_licenses_nothing(home, monkeypatch, marker):
    (home / "userdir" / outputs.DIR_MARKER).write_text(json.dumps(marker))
    before = snapshot(home)
    line = refused(monkeypatch, average.main, "mt-average", f"{C}/step_10", f"{C}/step_20", "-o", "userdir",
                   "--force")
    assert "-o userdir: " in line and "f.txt" in line and "even with --force" in line
    assert snapshot(home) == before


def test_a_marker_as_the_previous_version_wrote_it_still_licenses_its_files(home, monkeypatch):
    """The marker of commit ccc58ba's `write_dir` (command, time, the files it wrote)."""
    avg = home / "avg"
    shutil.copytree(home / C / "step_10", avg)
    (avg / "trainer_state.pt").unlink(missing_ok=True)
    files = sorted(p.name for p in avg.iterdir())
    (avg / outputs.DIR_MARKER).write_text(json.dumps(
        {"command": "mt-average", "time": "2026-11-20T10:00:00+0000", "files": files}) + "\n")
    ran(monkeypatch, average.main, "mt-average", f"{C}/step_10", f"{C}/step_20", "-o", "avg", "--force")
    assert json.loads((avg / outputs.DIR_MARKER).read_text())["files"] == files


def test_mt_export_never_replaces_a_users_folder_under_a_foreign_marker(home, monkeypatch):
    if not (home / "EX").is_dir():
        pytest.skip("no CTranslate2: no export")
    from transformer.commands import export

    (home / "userdir" / outputs.DIR_MARKER).write_text('{"command": "mt-export"}')
    before = snapshot(home)
    line = refused(monkeypatch, export.main, "mt-export", f"checkpoint={CK}", "output=userdir", "force=true")
    assert "output=userdir: holds files mt-export did not write (f.txt)" in line
    assert snapshot(home) == before


def test_mt_average_usage_errors_are_one_line_with_status_1(home, monkeypatch):
    line = refused(monkeypatch, average.main, "mt-average", "runs/x", "--last", "0", "-o", "y")
    assert "--last N takes one run directory and N >= 1" in line
    line = refused(monkeypatch, average.main, "mt-average", "runs/x")
    assert "-o/--output" in line


# --- mt-translate, mt-evaluate, mt-masks, mt-prepare ------------------------------------

TRANSLATE_REFUSED = [
    (["input.file=in.it", "output=in.it"], "output=in.it: is an input of this command"),
    (["input.file=in.it", "output=userdir"], "output=userdir: exists and is not a file"),
    (["input.file=in.it", "output=notes.txt"], "output=notes.txt: exists and is not an output of mt-translate"),
    (["input.file=in.it", "output=notes.txt", "force=true"], "even with force=true"),
    (["input.file=in.it", "output=notes.txt/out.en"], "notes.txt is a file, not a folder"),
    (["input.file=in.it", f"output={CK}/out.en"], "is inside an input of this command"),
    (["input.file=in.it", "output=runs/x"], "output=runs/x: is a run directory"),
    (["input.file=missing.it"], "input.file=missing.it: no such file"),
    (["input.file=userdir"], "input.file=userdir: is a directory; give a file"),
    (["input.file="], "input.file=: empty; give a file"),
    (["input.text=Ciao", "input.target_prefix_file="], "input.target_prefix_file=: empty; give a file"),
    (["input.file=in.it", "output="], "output=: empty: name a file"),
]


@pytest.mark.parametrize(("args", "why"), TRANSLATE_REFUSED, ids=[a[-1] for a, _ in TRANSLATE_REFUSED])
def test_mt_translate_refuses_before_translating(home, monkeypatch, args, why):
    before = snapshot(home)
    line = refused(monkeypatch, translate.main, "mt-translate", f"checkpoint={CK}", *args)
    assert why in line
    assert snapshot(home) == before


def test_mt_translate_makes_missing_folders_and_replaces_only_its_own_unchanged_file(home, monkeypatch):
    args = ("mt-translate", f"checkpoint={CK}", "input.file=in.it", "output=missing/dir/out.en",
            "decode=greedy", "progress=false")
    ran(monkeypatch, translate.main, *args)
    first = (home / "missing/dir/out.en").read_bytes()
    assert first.count(b"\n") == 2
    assert "add force=true" in refused(monkeypatch, translate.main, *args)
    ran(monkeypatch, translate.main, *args, "force=true")
    assert (home / "missing/dir/out.en").read_bytes() == first
    (home / "missing/dir/out.en").write_text("edited by the user\n")
    assert "is not an output of mt-translate" in refused(monkeypatch, translate.main, *args, "force=true")
    assert (home / "missing/dir/out.en").read_text() == "edited by the user\n"


EVALUATE_REFUSED = [
    (["output_dir=notes.txt"], "output_dir=notes.txt: notes.txt/tatoeba-test.beam.hyp cannot be made: notes.txt is a file"),
    ([f"output_dir={CK}"], "is inside an input of this command"),
    # a run and its checkpoints are mt-train's: a file there and `resume=auto` refuses the run
    (["output_dir=runs/x"], "a run directory: never an output of mt-evaluate"),
    ([f"output_dir={C}"], "a run's checkpoints folder: never an output of mt-evaluate"),
    (["output_dir=runs/x/eval"], "a run directory: never an output of mt-evaluate"),
    ([f"output_dir={C}/step_10"], "a run's checkpoints folder: never an output of mt-evaluate"),
]


@pytest.mark.parametrize(("args", "why"), EVALUATE_REFUSED, ids=[a[0] for a, _ in EVALUATE_REFUSED])
def test_mt_evaluate_refuses_before_the_test_set(home, monkeypatch, args, why):
    before = snapshot(home)
    line = refused(monkeypatch, evaluate.main, "mt-evaluate", f"checkpoint={CK}", *args)
    assert why in line
    assert snapshot(home) == before


def test_mt_evaluate_replaces_its_files_only_with_force_and_shares_the_references(home, monkeypatch):
    (home / "t.it").write_text("Ciao\nGrazie\n")
    (home / "t.en").write_text("Hello\nThanks\n")
    args = ("mt-evaluate", f"checkpoint={CK}", "test_set=t.it,t.en", "output_dir=ev", "progress=false",
            "decode.beam_size=2")
    ran(monkeypatch, evaluate.main, *args)
    ran(monkeypatch, evaluate.main, *args, "decode=greedy")  # t.it.ref again, the same text: fine
    assert sorted(p.name for p in (home / "ev").iterdir()) == [
        ".mt-outputs.json", "t.it.beam.hyp", "t.it.beam.json", "t.it.greedy.hyp", "t.it.greedy.json", "t.it.ref"]
    before = snapshot(home)
    assert "ev/t.it.beam.hyp exists (an earlier output of mt-evaluate): add force=true" in refused(
        monkeypatch, evaluate.main, *args)
    assert snapshot(home) == before
    ran(monkeypatch, evaluate.main, *args, "force=true")


INSIDE_A_RUN = [
    (translate.main, "mt-translate", f"checkpoint={CK}", "input.file=in.it", "output=runs/x/out.en"),
    (translate.main, "mt-translate", f"checkpoint={CK}", "input.file=in.it", f"output={C}/out.en"),
    (masks_cli.main, "mt-masks", "sentences=[Ciao]", "translations=[Hello]", "output=runs/x/tb/m.png"),
    (prepare.main, "mt-prepare", "data=sample", "data.cache_dir={home}/runs/x/cache"),  # not under cwd
    (average.main, "mt-average", f"{C}/step_10", f"{C}/step_20", "-o", "runs/x/avg"),
    (average.main, "mt-average", f"{C}/step_10", f"{C}/step_20", "-o", f"{C}/deeper/avg"),
]


@pytest.mark.parametrize("name", ["step_30", "best"])
def test_an_average_never_takes_the_name_of_a_checkpoint_mt_train_writes(home, monkeypatch, name):
    """resume=auto would take `step_30` (no trainer state) for the newest; training replaces `best`."""
    shutil.rmtree(home / C / "best")
    before = snapshot(home)
    line = refused(monkeypatch, average.main, "mt-average", f"{C}/step_10", f"{C}/step_20", "-o", f"{C}/{name}")
    assert f"-o {C}/{name}: is the name of a checkpoint mt-train writes" in line
    assert snapshot(home) == before


@pytest.mark.parametrize("name", ["step_40.tmp-99999", "best.old-7", "step_50.old-12", "avg.tmp-3"])
def test_an_average_never_takes_a_name_mt_train_tidies(home, monkeypatch, name):
    """resume=auto deletes `NAME.tmp-N` as an unfinished write and restores `NAME.old-N` as
    `NAME`: an average named so would be lost or taken for a step checkpoint."""
    before = snapshot(home)
    line = refused(monkeypatch, average.main, "mt-average", f"{C}/step_10", f"{C}/step_20", "-o", f"{C}/{name}")
    assert f"-o {C}/{name}: is named as an unfinished write" in line and "avg5" in line
    assert snapshot(home) == before


@pytest.mark.parametrize("case", INSIDE_A_RUN, ids=[c[-1] for c in INSIDE_A_RUN])
def test_no_command_writes_inside_a_run(home, monkeypatch, case):
    """Only mt-average's checkpoint may join a run's checkpoints (`-o runs/x/checkpoints/avg`,
    the recipes in docs/recipes.md): anything else there is refused, and the run resumes."""
    main, *argv = (c.format(home=home) if isinstance(c, str) else c for c in case)
    before = snapshot(home)
    line = refused(monkeypatch, main, *argv)
    assert "is inside " in line and "never an output of" in line and argv[-1].split("=")[-1] in line
    assert snapshot(home) == before


def test_mt_masks_refuses_a_picture_it_did_not_write(home, monkeypatch):
    before = snapshot(home)
    line = refused(monkeypatch, masks_cli.main, "mt-masks", "sentences=[Ciao]", "translations=[Hello]",
                   "output=notes.txt")
    assert "output=notes.txt: exists and is not an output of mt-masks" in line
    assert snapshot(home) == before


def test_mt_masks_on_an_export_says_it_needs_a_checkpoint(home, monkeypatch):
    if not (home / "EX").is_dir():
        pytest.skip("no CTranslate2: no export")
    line = refused(monkeypatch, masks_cli.main, "mt-masks", "checkpoint=EX", "sentences=[Ciao]", "output=null")
    assert "checkpoint=EX is an mt-export (CTranslate2) directory" in line
    assert "PyTorch checkpoint" in line and "decode.precision" not in line


PREPARE_REFUSED = [
    ("notes.txt", "data.cache_dir={home}/notes.txt: exists and is not a folder"),
    ("userdir", "holds files mt-prepare did not write (f.txt)"),
    ("notes.txt/cache", "notes.txt is a file, not a folder"),
    ("runs/x", "is a run directory"),
    (str(SAMPLE), "holds an input of this command"),
]


@pytest.mark.parametrize(("cache", "why"), PREPARE_REFUSED, ids=[c for c, _ in PREPARE_REFUSED])
def test_mt_prepare_refuses_a_cache_dir_that_is_not_a_cache(home, monkeypatch, cache, why):
    before = snapshot(home)
    target = cache if cache.startswith("/") else f"{home}/{cache}"
    line = refused(monkeypatch, prepare.main, "mt-prepare", "data=sample", f"data.cache_dir={target}")
    assert why.format(home=home) in line
    assert snapshot(home) == before


TRAIN_REFUSED = [
    ("notes.txt", "trainer.run_dir=notes.txt: exists and is not a directory"),
    ("notes.txt/run", "trainer.run_dir=notes.txt/run: cannot be made: notes.txt is a file"),
    ("userdir", "trainer.run_dir=userdir holds files mt-train did not write (f.txt)"),
]


@pytest.mark.parametrize(("run_dir", "why"), TRAIN_REFUSED, ids=[r for r, _ in TRAIN_REFUSED])
def test_mt_train_refuses_a_run_directory_that_is_not_one(home, monkeypatch, run_dir, why):
    before = snapshot(home)
    line = refused(monkeypatch, train.main, "mt-train", "debug=default", "data=sample",
                   f"trainer.run_dir={run_dir}")
    assert why in line
    assert snapshot(home) == before
    assert {p.name for p in home.iterdir()} <= {"runs", "userdir", "notes.txt", "in.it", "EX"}  # nothing made


def test_mt_train_refuses_a_run_directory_it_cannot_make_in_one_line(home, monkeypatch):
    """A folder it may not write in, or a file system that makes nothing (/proc): Hydra's
    mkdir ended in a traceback. (The test may run as root, who may write anywhere: the
    permission is taken away from this process's view, `os.access`.)"""
    (home / "locked").mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p).absolute() != home / "locked" and real(p, mode))
    before = snapshot(home)
    line = refused(monkeypatch, train.main, "mt-train", "debug=default", "data=sample", "trainer.run_dir=locked/run")
    assert line == "mt-train: error: trainer.run_dir=locked/run: cannot be written: no permission to write in locked"
    assert snapshot(home) == before
    line = refused(monkeypatch, train.main, "mt-train", "debug=default", "data=sample", "trainer.run_dir=/proc/mt-run")
    assert line.startswith("mt-train: error: trainer.run_dir=/proc/mt-run: cannot be made (")


# --- the rule itself ------------------------------------------------------------------


def test_an_empty_directory_may_be_written_and_a_symlink_never(tmp_path):
    (tmp_path / "empty").mkdir()
    outputs.check(Output.of(tmp_path / "empty", "-o", "mt-average", is_dir=True))
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    with pytest.raises(OutputError, match="symbolic link"):
        outputs.check(Output.of(tmp_path / "link", "-o", "mt-average", is_dir=True))


def test_a_refused_output_is_a_users_mistake_but_not_a_bad_setting():
    """The setting is valid; the place it names is taken: one line from the commands
    (`UserError`), and no `except ConfigError`/`ValueError` takes it for a bad value."""
    assert issubclass(OutputError, UserError)
    assert not issubclass(OutputError, (ConfigError, ValueError))
