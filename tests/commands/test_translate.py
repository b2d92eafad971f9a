"""mt-translate on a tiny random checkpoint built in tmp_path: files, stdin, n-best lines,
and one-line errors. (translate_lines itself: tests/decoding/test_text.py.)"""

from __future__ import annotations

import io
import os
import select
import shutil
import subprocess
import sys
import threading
import time

import pytest

from transformer import Translator
from transformer.checkpoint import load_model
from transformer.commands import translate
from transformer.config import DecodeConfig
from transformer.data.corpus import read_lines
from transformer.decoding import text as decoding
from transformer.paths import PROJECT_ROOT

from helpers import FAST, LINES

ROOT = PROJECT_ROOT


def run_main(monkeypatch, *overrides: str) -> None:
    """Call mt-translate's Hydra main in this process, as the console script would."""
    monkeypatch.setattr(sys, "argv", ["mt-translate", *overrides])
    translate.main()


def test_cli_file_in_file_out_keeps_lines(checkpoint, loaded, tmp_path, monkeypatch):
    src, out = tmp_path / "in.it", tmp_path / "out.en"
    src.write_text("".join(f"{line}\n" for line in LINES), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    run_main(monkeypatch, f"checkpoint={checkpoint}", f"input.file={src}", f"output={out}",
             "decode=greedy", "decode.max_len_a=0", "decode.max_len_b=6", "progress=false")
    model, tokenizer = loaded
    expected = decoding.translate_lines(model, tokenizer, LINES, DecodeConfig(**FAST))
    assert read_lines(out) == expected
    # no Hydra litter; the marker that says mt-translate wrote out.en (transformer/outputs.py)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".mt-outputs.json", "in.it", "out.en"]


def test_cli_reads_stdin_and_names_a_bad_line(checkpoint, loaded, monkeypatch, capsys):
    text = "".join(f"{line}\r\n" for line in LINES)  # Windows line ends too
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    run_main(monkeypatch, f"checkpoint={checkpoint}", "decode=greedy", "decode.max_len_a=0",
             "decode.max_len_b=6")
    model, tokenizer = loaded
    expected = decoding.translate_lines(model, tokenizer, LINES, DecodeConfig(**FAST))
    assert capsys.readouterr().out == "".join(f"{line}\n" for line in expected)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"Ciao\nperch\xe9?\n")))
    with pytest.raises(SystemExit) as exit_info:
        run_main(monkeypatch, f"checkpoint={checkpoint}")
    assert exit_info.value.code == ("mt-translate: error: <stdin>:2: not valid UTF-8 "
                                    "(byte b'\\xe9' at column 6)")


def test_cli_nbest_lines(checkpoint, monkeypatch, capsys):
    run_main(monkeypatch, f"checkpoint={checkpoint}", "input.text='Che ore sono?\n\nSì!'",
             "decode=beam", "decode.beam_size=3", "decode.nbest=2", "decode.max_len_a=0",
             "decode.max_len_b=5")
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" ||| ")[0] for line in lines] == ["0", "0", "1", "2", "2"]
    assert lines[2] == "1 |||  ||| 0.0000"  # the empty line: not decoded
    scores = [float(line.split(" ||| ")[2]) for line in lines]
    assert scores[0] >= scores[1] and scores[3] >= scores[4]  # best first


def test_cli_missing_checkpoint_exits_with_a_message(tmp_path, monkeypatch):
    with pytest.raises(SystemExit) as exit_info:
        run_main(monkeypatch, f"checkpoint={tmp_path / 'nowhere'}", "input.text=Ciao")
    assert exit_info.value.code == f"mt-translate: error: checkpoint={tmp_path / 'nowhere'}: no such directory"
    with pytest.raises(SystemExit) as exit_info:
        run_main(monkeypatch, "input.text=Ciao")
    assert "add checkpoint=path/to/checkpoint_dir" in str(exit_info.value.code)


def test_cli_corrupt_checkpoint_is_one_clear_error(checkpoint, tmp_path):
    # A real process (about 5 s of imports): exit status and stderr as a user sees them.
    bad = tmp_path / "ckpt"
    bad.mkdir()
    for f in checkpoint.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    (bad / "model.safetensors").write_bytes(b"not a safetensors file")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "transformer.commands.translate", f"checkpoint={bad}", "input.text=Ciao"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.startswith(f"mt-translate: error: corrupt weights {bad}")
    assert "Traceback" not in proc.stderr


def test_an_interactive_pipe_gets_each_line_before_its_input_ends(checkpoint):
    """mt-translate reads stdin a batch at a time and closes a batch when nothing more is
    waiting: a line written into a pipe that stays open comes back translated."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "transformer.commands.translate", f"checkpoint={checkpoint}",
         "decode=greedy", "decode.max_len_a=0", "decode.max_len_b=4"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        answers = []
        for line in ("Ciao!", "Che ore sono?"):
            proc.stdin.write(f"{line}\n".encode())
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], 120)  # stdin still open
            assert ready, "no output before the end of the input"
            answers.append(proc.stdout.readline().decode().rstrip("\n"))
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0 and proc.stdout.read() == b""
    finally:
        proc.kill()
    model, tokenizer = load_model(checkpoint)
    cfg = DecodeConfig(method="greedy", max_len_a=0, max_len_b=4)
    assert answers == decoding.translate_lines(model, tokenizer, ["Ciao!", "Che ore sono?"], cfg)
    assert "translated 2 line(s), 2 sentence(s)" in proc.stderr.read().decode()


def test_a_file_streams_in_windows_with_its_line_numbers(checkpoint, tmp_path, monkeypatch, capfd):
    """Lines translated a window at a time give what the whole file gives; a warning names
    the file's line, not the window's."""
    lines = [*LINES, "Ciao " * 40, *LINES]  # line 7 is longer than the model's 32 positions
    src, out = tmp_path / "in.it", tmp_path / "out.en"
    src.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    run_main(monkeypatch, f"checkpoint={checkpoint}", f"input.file={src}", f"output={out}",
             "decode=greedy", "decode.max_len_a=0", "decode.max_len_b=3", "decode.batch_tokens=8",
             "progress=false")
    model, tokenizer = load_model(checkpoint)
    whole = decoding.translate_lines(model, tokenizer, lines, DecodeConfig(**{**FAST, "max_len_b": 3}))
    assert read_lines(out) == whole
    err = capfd.readouterr().err
    assert "longer than the model's limit of 32 tokens" in err and "(line 7)" in err


def test_an_input_file_that_is_not_a_regular_file_is_read_as_a_stream(checkpoint, loaded, tmp_path):
    """A FIFO, /dev/stdin, `<(...)` and /dev/null exist: they were refused as "corpus file
    not found"; each is read once, as it comes."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "transformer.commands.translate", f"checkpoint={checkpoint}",
           "decode=greedy", "decode.max_len_a=0", "decode.max_len_b=6"]
    model, tokenizer = loaded
    expected = "".join(f"{line}\n" for line in decoding.translate_lines(model, tokenizer, LINES, DecodeConfig(**FAST)))
    text = "".join(f"{line}\n" for line in LINES).encode()
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    proc = subprocess.Popen([*cmd, f"input.file={fifo}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    while proc.poll() is None:  # until mt-translate opens it for reading (or ends without)
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: no reader yet
            time.sleep(0.05)
            continue
        os.set_blocking(fd, True)
        with os.fdopen(fd, "wb") as f:
            f.write(text)
        break
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert out.decode() == expected
    piped = subprocess.run([*cmd, "input.file=/dev/stdin"], input=text, capture_output=True, env=env, timeout=120)
    assert piped.returncode == 0 and piped.stdout.decode() == expected, piped.stderr.decode()
    empty = subprocess.run([*cmd, "input.file=/dev/null"], capture_output=True, env=env, timeout=120)
    assert empty.returncode == 0 and empty.stdout == b"", empty.stderr.decode()


def test_a_run_directory_translates_with_its_best_checkpoint(checkpoint, loaded, tmp_path, monkeypatch,
                                                             capsys):
    """checkpoint=RUN_DIR: the run's best; a missing best's error lists the step checkpoints."""
    run_dir = tmp_path / "run"
    shutil.copytree(checkpoint, run_dir / "checkpoints" / "best")
    args = ("input.text=Che ore sono?", "decode=greedy", "decode.max_len_a=0", "decode.max_len_b=6")
    run_main(monkeypatch, f"checkpoint={run_dir}", *args)
    model, tokenizer = loaded
    expected = decoding.translate_lines(model, tokenizer, ["Che ore sono?"], DecodeConfig(**FAST))
    assert capsys.readouterr().out == f"{expected[0]}\n"
    (run_dir / "checkpoints" / "best").rename(run_dir / "checkpoints" / "step_10")
    with pytest.raises(SystemExit) as exit_info:
        run_main(monkeypatch, f"checkpoint={run_dir}/checkpoints/best", *args)
    assert exit_info.value.code == (f"mt-translate: error: checkpoint={run_dir}/checkpoints/best: no such "
                                    f"directory; {run_dir}/checkpoints holds step_10 (best is written at "
                                    "the run's first validation; checkpoint=RUN_DIR takes the newest)")


PREFIX_LINES = ["Hello", "", "Yes", "", "", "We"]  # one per line of LINES (an empty line: none)


def piped(data: bytes, opened: list[int]) -> str:
    """What `<(...)` gives a command: /dev/fd/N, the read end of a pipe (a thread writes
    `data` into it and closes it). N goes into `opened`, for the caller to close."""
    read, write = os.pipe()
    opened.append(read)

    def fill() -> None:
        with os.fdopen(write, "wb") as f:
            f.write(data)

    threading.Thread(target=fill, daemon=True).start()
    return f"/dev/fd/{read}"


def fifo(path, data: bytes):
    """A FIFO at `path` that a thread fills once a reader opens it."""
    os.mkfifo(path)

    def fill() -> None:
        with open(path, "wb") as f:  # blocks until the command opens it
            f.write(data)

    threading.Thread(target=fill, daemon=True).start()
    return path


def lines_of(texts: list[str]) -> bytes:
    return "".join(f"{t}\n" for t in texts).encode()


def test_prefixes_pair_with_a_streamed_input_and_may_come_from_a_stream(checkpoint, tmp_path, monkeypatch, capsys):
    """A streamed input (here `<(...)`) with a prefix file, and a prefix file that is a
    FIFO: each is read once (the input whole, to be counted against the prefixes) and
    translated as a regular file is."""
    expected = Translator.load(checkpoint).translate(LINES, target_prefix=[p or None for p in PREFIX_LINES], **FAST)
    regular_in, regular_prefix = tmp_path / "in.it", tmp_path / "prefix.en"
    regular_in.write_bytes(lines_of(LINES))
    regular_prefix.write_bytes(lines_of(PREFIX_LINES))
    opened: list[int] = []
    try:
        cases = {"streamed input": (piped(lines_of(LINES), opened), regular_prefix),
                 "FIFO prefixes": (regular_in, fifo(tmp_path / "prefix.fifo", lines_of(PREFIX_LINES))),
                 "both streamed": (piped(lines_of(LINES), opened), piped(lines_of(PREFIX_LINES), opened))}
        for case, (source, prefix) in cases.items():
            run_main(monkeypatch, f"checkpoint={checkpoint}", f"input.file={source}",
                     f"input.target_prefix_file={prefix}", "decode=greedy", "decode.max_len_a=0",
                     "decode.max_len_b=6", "progress=false")
            assert capsys.readouterr().out.splitlines() == expected, case
        source = piped(lines_of(LINES[:4]), opened)  # fewer lines than prefixes: counted, refused
        with pytest.raises(SystemExit) as exit_info:
            run_main(monkeypatch, f"checkpoint={checkpoint}", f"input.file={source}",
                     f"input.target_prefix_file={regular_prefix}")
        assert exit_info.value.code == (f"mt-translate: error: input.target_prefix_file={regular_prefix} has 6 "
                                        "line(s) and the input 4: give one prefix line (or an empty one) per "
                                        "input line")
    finally:
        for fd in opened:
            os.close(fd)
