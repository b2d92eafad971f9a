"""Every command answers a user's mistake in one line, before any work, and loses nothing."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer.checkpoint import CheckpointError, load_model, save_checkpoint
from transformer.commands import cli, evaluate, prepare, train, translate
from transformer.config import DataConfig, DecodeConfig
from transformer.data.corpus import DataError, read_lines
from transformer.data.pipeline import prepare_data
from transformer.data.tokenizer import VocabularyError, train_tokenizer
from transformer.decoding.text import translate_lines
from transformer.errors import file_error
from transformer.paths import PROJECT_ROOT

from helpers import DEBUG, shared_cache, tiny_checkpoint

SAMPLE = PROJECT_ROOT / "data" / "sample"
ENV = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A random tiny model (positions for 24 tokens) with a sample-trained vocabulary."""
    return tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "best", n_encoder_layers=1, n_decoder_layers=1,
                           max_positions=24)


def call(main, prog: str, monkeypatch, *args: str) -> str | int | None:
    """Run a command's main in this process; returns its exit code or message."""
    monkeypatch.setattr(sys, "argv", [prog, *args])
    with pytest.raises(SystemExit) as info:
        main()
    return info.value.code


# (command module, its name, arguments, the one line it must print). Each is refused from
# its settings alone: no data is prepared, no model loaded.
MISTAKES = [
    (train, "mt-train", ["optim.lr=-1"], "mt-train: error: optim.lr=-1.0: must be > 0"),
    (train, "mt-train", ["trainer.max_steps=many"],
     "mt-train: error: trainer.max_steps: Value 'many' of type 'str' could not be converted to Integer"),
    (train, "mt-train", ["optim.lrr=1"], "mt-train: error: optim.lrr: Key 'lrr' not in 'OptimConfig'"),
    (train, "mt-train", ["+optim.lrr=1"], "mt-train: error: optim.lrr: Key 'lrr' not in 'OptimConfig'"),
    (train, "mt-train", ["model.d_modle=64"], "mt-train: error: model.d_modle: Key 'd_modle' not in 'ModelConfig'"),
    (train, "mt-train", ["model.dropout=high"],
     "mt-train: error: model.dropout: Value 'high' of type 'str' could not be converted to Float"),
    (train, "mt-train", ["model=huge"], "mt-train: error: In 'train': Could not find 'model/huge' "
     "Available options in 'model': base big small tiny"),
    (train, "mt-train", ["trainer.precision=fp8"],
     "mt-train: error: trainer.precision='fp8': choose one of auto, fp32, bf16, fp16"),
    (prepare, "mt-prepare", ["data.spm_vocab_size=abc"],
     "mt-prepare: error: data.spm_vocab_size: Value 'abc' of type 'str' could not be converted to Integer"),
    (prepare, "mt-prepare", ["data.max_len=0"], "mt-prepare: error: data.max_len=0: must be >= 1"),
    (translate, "mt-translate", ["checkpoint=x", "decode=greedy", "decode.nbest=3"],
     "mt-translate: error: decode.nbest=3: greedy search gives one hypothesis: use decode=beam "
     "for an n-best list"),
    (translate, "mt-translate", ["checkpoint=x", "decode.max_len_a=-1", "decode.max_len_b=-5"],
     "mt-translate: error: decode.max_len_a=-1.0: must be >= 0"),
    (evaluate, "mt-evaluate", ["checkpoint=x", "max_sentences=0"],
     "mt-evaluate: error: max_sentences=0: must be >= 1 (or null)"),
    (evaluate, "mt-evaluate", ["checkpoint=x", "decode.beam_size=0"],
     "mt-evaluate: error: decode.beam_size=0: must be >= 1"),
    (evaluate, "mt-evaluate", ["checkpoint=x", "perturb=caps"],
     "mt-evaluate: error: perturb='caps': choose one of upper, title, nopunct, typos (or null)"),
    (train, "mt-train", ["data.augment.upper=2"],
     "mt-train: error: data.augment.upper=2.0: a probability must be in [0, 1]"),
]


@pytest.mark.parametrize(("module", "prog", "args", "line"), MISTAKES)
def test_a_bad_setting_is_one_line_naming_the_key(module, prog, args, line, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert call(module.main, prog, monkeypatch, *args) == line
    assert list(tmp_path.rglob("*")) == []  # nothing was written, not even the run directory


@pytest.mark.parametrize("prog", ["mt-train", "mt-prepare"])
def test_training_commands_print_no_traceback(prog, tmp_path):
    """As a user sees it: exit status 1 and one line on stderr (mt-train and mt-prepare used
    to print Hydra's traceback); MT_TRACEBACK=1 shows the traceback."""
    module = {"mt-train": "transformer.commands.train", "mt-prepare": "transformer.commands.prepare"}[prog]
    cmd = [sys.executable, "-m", module, "data.max_tokens=64"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120)
    expected = f"{prog}: error: data.max_tokens=64: a batch must hold the longest pair: more than data.max_len=128\n"
    assert (proc.returncode, proc.stderr, proc.stdout) == (1, expected, "")
    proc = subprocess.run(cmd, cwd=tmp_path, env={**ENV, "MT_TRACEBACK": "1"}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "ConfigError" in proc.stderr


def test_mt_train_refuses_a_vocabulary_smaller_than_the_corpus_alphabet(tmp_path, monkeypatch):
    line = call(train.main, "mt-train", monkeypatch, *DEBUG, "data.spm_vocab_size=40",
                f"trainer.run_dir={tmp_path / 'run'}", f"data.cache_dir={shared_cache()}")
    assert line.startswith("mt-train: error: data.spm_vocab_size=40 is too small: the corpus has ")
    assert "characters" in line and "raise data.spm_vocab_size" in line
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_too_large_vocabulary_is_named_too(tmp_path):
    with pytest.raises(VocabularyError, match=r"data.spm_vocab_size=50000 is too large for this corpus"):
        prepare_data(DataConfig(name="sample", spm_vocab_size=50000, cache_dir=str(tmp_path)))


def test_a_corrupt_cached_tokenizer_names_the_file_and_how_to_rebuild(tmp_path):
    cfg = DataConfig(name="sample", spm_vocab_size=200, cache_dir=str(tmp_path), num_proc=1)
    prepared = prepare_data(cfg)
    spm = next(tmp_path.glob("spm-*.model"))
    spm.write_bytes(b"\x00 not a sentencepiece model")
    with pytest.raises(DataError, match=rf"corrupt cached tokenizer {spm}: it is not what was written .*delete it "
                                        rf"and {prepared.path} to rebuild"):
        prepare_data(cfg)


def test_a_tokenizer_that_does_not_fit_the_checkpoint_is_named(checkpoint, tmp_path):
    other = train_tokenizer(read_lines(SAMPLE / "train.en"), vocab_size=150)
    model, _ = load_model(checkpoint)
    bad = save_checkpoint(tmp_path / "mixed", model, other, "", {})
    with pytest.raises(CheckpointError, match=r"has 150 pieces but the model .* has vocab_size=300: "
                                              r"the tokenizer does not belong to this checkpoint"):
        load_model(bad)


def test_translate_with_stdin_or_stdout_closed_says_so(checkpoint, monkeypatch):
    monkeypatch.setattr(sys, "stdin", None)
    assert call(translate.main, "mt-translate", monkeypatch, f"checkpoint={checkpoint}") == (
        "mt-translate: error: stdin is closed and no input was given: add input.file=FILE or input.text=...")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"Ciao\n")))
    monkeypatch.setattr(sys, "stdout", None)
    assert call(translate.main, "mt-translate", monkeypatch, f"checkpoint={checkpoint}") == (
        "mt-translate: error: stdout is closed: add output=FILE")


def test_translate_into_a_closed_pipe_exits_quietly(checkpoint, tmp_path):
    src = tmp_path / "in.it"
    src.write_text("Ciao!\n" * 2000, encoding="utf-8")
    cmd = (f"{sys.executable} -m transformer.commands.translate checkpoint={checkpoint} input.file={src} "
           f"decode=greedy decode.max_len_a=0 decode.max_len_b=2 progress=false | head -1")
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.count("\n") == 1 and "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


def test_evaluate_on_an_empty_test_set_says_so(checkpoint, tmp_path, monkeypatch):
    (tmp_path / "src.it").write_text("\n\n", encoding="utf-8")
    (tmp_path / "ref.en").write_text("\n\n", encoding="utf-8")
    pair = f"{tmp_path / 'src.it'},{tmp_path / 'ref.en'}"
    line = call(evaluate.main, "mt-evaluate", monkeypatch, f"checkpoint={checkpoint}",
                f"test_set='{pair}'", f"output_dir={tmp_path / 'out'}")
    assert line == f"mt-evaluate: error: test set '{pair}' has no sentence pairs to score"
    assert not (tmp_path / "out").exists()


def test_min_len_the_model_cannot_write_is_refused(checkpoint):
    model, tokenizer = load_model(checkpoint)  # max_len 24: at most 23 output tokens
    cfg = DecodeConfig(method="beam", beam_size=2, nbest=2, min_len=30, max_len_a=0, max_len_b=3)
    with pytest.raises(ValueError, match=r"decode.min_len=30: this model writes at most 23 tokens"):
        translate_lines(model, tokenizer, ["Ciao!"], cfg)


def test_min_len_above_a_sentences_limit_is_a_logged_adjustment(checkpoint, caplog):
    model, tokenizer = load_model(checkpoint)
    cfg = DecodeConfig(method="beam", beam_size=2, nbest=2, min_len=6, max_len_a=0, max_len_b=3)
    from transformer.decoding.text import translate_nbest

    nbest = translate_nbest(model, tokenizer, ["Ciao!", "Ci vediamo domani."], cfg)
    assert "decode.min_len=6 is above the length limit a * |x| + b (a=0, b=3) of 2 sentence(s)" in caplog.text
    for hyps in nbest:  # nbest lines, each at least min_len tokens, none scored -inf
        assert len(hyps) == 2
        assert all(score > float("-inf") for _, score in hyps)
        assert all(len(tokenizer.encode([text])[0]) >= 1 for text, _ in hyps)


# --- a bug is a bug: only the project's own errors are one line ---------------------------


def test_a_bug_keeps_its_traceback_and_a_user_error_is_one_line(monkeypatch):
    """cli.run catches errors.UserError (and OmegaConf's), not a bare ValueError or OSError:
    those come from bugs (ours, torch's, numpy's) and must show where they happened."""
    monkeypatch.delenv("MT_TRACEBACK", raising=False)

    def bug():
        raise ValueError("shapes disagree deep inside")

    with pytest.raises(ValueError, match="shapes disagree"):
        cli.run("mt-x", bug)
    with pytest.raises(FileNotFoundError):
        cli.run("mt-x", lambda: Path("/nonexistent/internal/file").read_text())
    with pytest.raises(SystemExit) as info:
        cli.run("mt-x", lambda: (_ for _ in ()).throw(DataError("in.it:3: not valid UTF-8")))
    assert info.value.code == "mt-x: error: in.it:3: not valid UTF-8"
    with pytest.raises(SystemExit) as info:
        cli.run("mt-x", lambda: (_ for _ in ()).throw(
            file_error(PermissionError(13, "Permission denied"), "in.it", "read", "input.file")))
    assert info.value.code == "mt-x: error: input.file=in.it: cannot read it (Permission denied)"


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_device_cuda_on_a_cpu_names_the_commands_own_key(checkpoint, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.it").write_text("Ciao\n")
    (tmp_path / "t.en").write_text("Hello\n")
    want = "error: device=cuda, but CUDA is not available on this machine: use device=cpu or device=auto"
    assert call(translate.main, "mt-translate", monkeypatch, f"checkpoint={checkpoint}", "input.text=Ciao",
                "device=cuda") == f"mt-translate: {want}"
    assert call(evaluate.main, "mt-evaluate", monkeypatch, f"checkpoint={checkpoint}", "test_set=t.it,t.en",
                "device=cuda") == f"mt-evaluate: {want}"
    assert not (tmp_path / "outputs").exists()


def test_a_path_with_an_accented_letter_just_works(checkpoint, tmp_path, monkeypatch):
    folder = tmp_path / "my dir"
    folder.mkdir()
    (folder / "città.it").write_text("Ciao\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["mt-translate", f"checkpoint={checkpoint}", "input.file=my dir/città.it",
                                      "output=così.en", "progress=false", "decode=greedy"])
    translate.main()
    assert (tmp_path / "così.en").read_text().count("\n") == 1


@pytest.mark.parametrize(("arg", "example"), [
    ("input.file=dir/città's.it", r'"input.file=\"dir/città' + "'" + r's.it\""'),
    ("sentences=[città, così]", """'sentences=["città", "così"]'"""),
])
def test_a_value_hydra_cannot_read_says_how_to_quote_it(arg, example, monkeypatch):
    from transformer.commands import masks

    line = call(masks.main, "mt-masks", monkeypatch, arg)
    assert line == (f"mt-masks: error: {arg}: Hydra cannot read this value: put it in quotes, and the "
                    f"whole setting in quotes for the shell: {example}")
