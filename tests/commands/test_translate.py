"""mt-translate and translate_lines on a tiny random checkpoint built in tmp_path."""

from __future__ import annotations

import io
import logging
import os
import select
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer import device as device_module
from transformer.checkpoint import load_meta, load_model, save_checkpoint
from transformer.commands import translate
from transformer.commands.average import main as average_main
from transformer.config import DecodeConfig
from transformer.data.batching import length_batches
from transformer.data.corpus import read_lines
from transformer.decoding import text as decoding
from transformer.inspect.attention_plots import cross_attention, plot_alignment
from transformer.model.transformer import build_model
from transformer.paths import PROJECT_ROOT

from helpers import tiny_checkpoint

ROOT = PROJECT_ROOT
LINES = ["Che ore sono?", "", "Ti chiamo stasera.", "   ", "Sì, certo!", "Ci vediamo martedì alle due."]
FAST = dict(method="greedy", max_len_a=0.0, max_len_b=6)  # a random model never stops early


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A random tiny model with a SentencePiece vocabulary trained on data/sample."""
    return tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "best", max_positions=32)


@pytest.fixture(scope="module")
def loaded(checkpoint):
    return load_model(checkpoint)


def run_main(monkeypatch, *overrides: str) -> None:
    """Call mt-translate's Hydra main in this process, as the console script would."""
    monkeypatch.setattr(sys, "argv", ["mt-translate", *overrides])
    translate.main()


def test_translate_lines_keeps_order_and_empty_lines(loaded):
    model, tokenizer = loaded
    cfg = DecodeConfig(**FAST, max_tokens=12)  # several batches, sorted by length
    out = decoding.translate_lines(model, tokenizer, LINES, cfg)
    assert len(out) == len(LINES)
    assert out[1] == "" and out[3] == ""
    alone = [decoding.translate_lines(model, tokenizer, [line], cfg)[0] for line in LINES]
    assert out == alone
    assert all(out[i] for i in (0, 2, 4, 5))


def test_translate_lines_restores_training_mode(loaded):
    model, tokenizer = loaded
    model.train()
    decoding.translate_lines(model, tokenizer, LINES[:1], DecodeConfig(**FAST))
    assert model.training
    model.eval()


def test_too_long_input_is_translated_in_pieces_with_a_warning(loaded, caplog):
    model, tokenizer = loaded
    long_line = " ".join(["Ci vediamo martedì alle due"] * 20)  # one sentence > max_len = 32 tokens
    with caplog.at_level(logging.WARNING):
        out = decoding.translate_lines(model, tokenizer, [long_line], DecodeConfig(**FAST))
    assert len(out) == 1 and out[0]
    assert "1 input line(s) hold a sentence longer than the model's limit of 32 tokens" in caplog.text


def test_decode_defaults_depend_on_the_device(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda:0")  # no CUDA needed: capabilities mocked
    monkeypatch.setattr(device_module, "cpu_bf16_support", lambda: (False, "AVX2 only"))
    monkeypatch.setattr(device_module, "cuda_bf16_support", lambda device: (True, "a GPU"))
    settings = decoding.decode_settings
    assert settings(DecodeConfig(), cpu) == DecodeConfig(max_tokens=2000, precision="fp32")
    assert settings(DecodeConfig(), cuda) == DecodeConfig(max_tokens=8000, precision="bf16")
    monkeypatch.setattr(device_module, "cpu_bf16_support", lambda: (True, "AVX512-BF16"))
    assert settings(DecodeConfig(), cpu) == DecodeConfig(max_tokens=2000, precision="bf16")
    monkeypatch.setattr(device_module, "cuda_bf16_support", lambda device: (False, "an old GPU"))
    assert settings(DecodeConfig(), cuda).precision == "fp16"
    given = DecodeConfig(max_tokens=123, precision="fp32")
    assert settings(given, cuda) == given
    with pytest.raises(ValueError, match=r"decode.max_tokens=0: must be >= 1 \(or null\)"):
        settings(DecodeConfig(max_tokens=0), cpu)
    with pytest.raises(ValueError, match=r"decode.precision=fp16 needs CUDA"):
        settings(DecodeConfig(precision="fp16"), cpu)


def test_length_batches_respect_max_tokens_and_cover_every_line():
    lengths = [5, 1, 9, 3, 3, 7, 2, 20]
    batches = length_batches(lengths, max_tokens=10)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        longest = max(lengths[i] for i in b)
        assert len(b) * longest <= 10 or len(b) == 1


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


def test_averaged_checkpoint_holds_the_mean_weights_and_translates(loaded, tmp_path, capsys):
    # Checkpoint averaging (transformer/commands/average.py): three step checkpoints of a run.
    model, tokenizer = loaded
    states = []
    for step, seed in [(100, 1), (200, 2), (300, 3)]:
        torch.manual_seed(seed)
        m = build_model(model.cfg)
        states.append(m.state_dict())
        save_checkpoint(tmp_path / "run" / "checkpoints" / f"step_{step}", m, tokenizer,
                        f"seed: {seed}\n", {"step": step}, trainer_state={"step": step})
    out = tmp_path / "avg"
    average_main([str(tmp_path / "run"), "--last", "2", "-o", str(out)])
    avg, _ = load_model(out)
    for k, v in avg.state_dict().items():
        torch.testing.assert_close(v, (states[1][k] + states[2][k]) / 2)
    assert avg.src_embed.weight is avg.out_proj.weight  # still tied
    assert load_meta(out)["step"] == 300 and not (out / "trainer_state.pt").exists()
    assert (out / "config.yaml").read_text() == "seed: 3\n"
    assert "averaged 2 checkpoints (step_200, step_300)" in capsys.readouterr().out
    assert decoding.translate_lines(avg, tokenizer, LINES[:1], DecodeConfig(**FAST))[0]
    with pytest.raises(SystemExit, match="fewer than --last 4"):
        average_main([str(tmp_path / "run"), "--last", "4", "-o", str(out)])


def test_attention_picture_of_a_greedy_translation(loaded, tmp_path):
    model, tokenizer = loaded
    sentence = "Ci vediamo martedì alle due."
    alignment = cross_attention(model, tokenizer, sentence, layer=-1, max_len_a=0, max_len_b=5)
    assert alignment.src_pieces == tokenizer.pieces(sentence)
    assert alignment.tgt_pieces[-1] == tokenizer.id_to_piece(tokenizer.eos_id)
    assert alignment.weights.shape == (len(alignment.tgt_pieces), len(alignment.src_pieces))
    torch.testing.assert_close(alignment.weights.sum(dim=1), torch.ones(len(alignment.tgt_pieces)))
    assert alignment.layer == len(model.decoder_layers) - 1
    assert not model.decoder_layers[-1].cross_attn.store_weights  # switched off again
    png = plot_alignment(alignment, tmp_path / "attention.png")
    assert png.read_bytes().startswith(b"\x89PNG")


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
             "decode=greedy", "decode.max_len_a=0", "decode.max_len_b=3", "decode.max_tokens=8",
             "progress=false")
    model, tokenizer = load_model(checkpoint)
    whole = decoding.translate_lines(model, tokenizer, lines, DecodeConfig(**{**FAST, "max_len_b": 3}))
    assert read_lines(out) == whole
    err = capfd.readouterr().err
    assert "longer than the model's limit of 32 tokens" in err and "(line 7)" in err
