"""mt-train: end to end (a debug run's checkpoint, TensorBoard events and log; the console
command) and its configs (every experiment composes, overrides reach the dataclasses,
mistakes fail before anything runs).

The trainer's own tests are in tests/training/test_trainer.py; DDP in
tests/training/test_distributed.py, a resume with another vocabulary in
tests/training/test_state.py, corrupt checkpoints in tests/test_checkpoint.py."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import subprocess
import sys

import pytest
import torch
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from transformer import checkpoint as ckpt
from transformer.commands.train import what_comes_next
from transformer.config import DataConfig, TrainConfig, TrainerConfig, to_dataclass
from transformer.paths import PROJECT_ROOT
from transformer.training.state import TrainState

from helpers import DEBUG, compose_cfg, run, scalars

CONFIGS = PROJECT_ROOT / "configs"


def test_debug_run_writes_a_loadable_checkpoint_and_tensorboard_events(tmp_path):
    trainer = run(tmp_path / "run")
    run_dir = tmp_path / "run"
    assert trainer.state.step == 20
    saved = ckpt.step_checkpoints(run_dir)
    assert saved and saved[-1].name == "step_20"
    model, tokenizer = ckpt.load_model(saved[-1])
    for a, b in zip(model.state_dict().values(), trainer.model.state_dict().values()):
        torch.testing.assert_close(a, b.cpu(), rtol=0, atol=0)
    assert tokenizer.vocab_size == model.cfg.vocab_size
    assert (run_dir / "checkpoints" / "best" / "model.safetensors").is_file()
    assert (run_dir / "config.yaml").is_file() and (run_dir / "train.log").is_file()
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    assert [s for s, _ in scalars(run_dir, "dev/bleu")] == [10, 20]
    assert [s for s, _ in scalars(run_dir, "dev/name_copy")] == [10, 20]  # the sample has a name
    assert scalars(run_dir, "train/loss")[-1][1] < scalars(run_dir, "train/loss")[0][1]
    clock = scalars(run_dir, "train/hours")  # the trainer's clock, beside every loss point
    assert [s for s, _ in clock] == [s for s, _ in scalars(run_dir, "train/loss")]
    assert all(a < b for (_, a), (_, b) in itertools.pairwise(clock))
    assert clock[-1][1] * 3600 <= trainer.state.train_seconds * (1 + 1e-6)  # TensorBoard keeps float32
    # Without a progress bar (trainer.progress=false) the log shows training progress.
    logged = (run_dir / "train.log").read_text()
    for step in (5, 10, 15, 20):
        assert f"step {step}: loss" in logged
    assert re.search(r"step 20 dev: loss .* chrF [\d.]+ names [\d.]+% \(\d+/\d+\)\n", logged)


def test_console_command_runs(tmp_path):
    """The real `python -m transformer.commands.train` entry point, as a user types it (a new cache:
    the data is prepared in the run)."""
    cmd = [sys.executable, "-m", "transformer.commands.train", *DEBUG, "trainer.max_steps=3",
           f"trainer.run_dir={tmp_path / 'run'}", f"data.cache_dir={tmp_path / 'cache'}"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "run" / "checkpoints" / "step_3" / "model.safetensors").is_file()
    assert not (tmp_path / "outputs").exists()  # Hydra leaves no litter in the working dir
    # trainer.progress=false (a run under nohup): no bar at all, the data preparation's neither
    assert "training a unigram tokenizer" in proc.stderr
    assert "it/s" not in proc.stderr and "examples/s" not in proc.stderr and "%|" not in proc.stderr
    # where the run went, at its start and its end, and what to run next: the last lines
    assert re.search(r"INFO \S+: run directory: run\n", proc.stderr)
    end = proc.stderr[proc.stderr.rindex("finished at step 3"):].splitlines()
    assert end[0].endswith("the run is in run; next, translate, evaluate and average:")
    assert end[1:] == ['    echo "Ciao, come stai?" | mt-translate checkpoint=run',
                       "    mt-evaluate checkpoint=run data=sample test_set=dev",
                       f"best dev BLEU {_best_bleu(tmp_path / 'run'):.2f}, at step 3: run/checkpoints/best"]


def _best_bleu(run_dir) -> float:
    return json.loads((run_dir / "checkpoints" / "best" / "meta.json").read_text())["best_bleu"]


def test_the_last_line_names_a_best_dev_bleu_only_after_a_validation(tmp_path, monkeypatch):
    """Stopped before its first validation, a run has no best: no score is printed (no -1
    sentinel); the commands it prints name the run directory, which takes the newest."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine" / "checkpoints" / "step_5").mkdir(parents=True)
    files = dict(name="files", train_src=str(tmp_path / "c" / "train.it"), train_tgt=str(tmp_path / "c" / "train.en"),
                 dev_src=str(tmp_path / "c" / "dev.it"), dev_tgt=str(tmp_path / "c" / "dev.en"))
    cfg = TrainConfig(data=DataConfig(**files), trainer=TrainerConfig(run_dir="mine"))
    text = what_comes_next(cfg, TrainState(step=5))
    assert text.splitlines()[2] == "    mt-evaluate checkpoint=mine test_set=c/dev.it,c/dev.en"
    assert "mt-average" not in text  # one step checkpoint: nothing to average
    assert text.splitlines()[-1] == "not validated, so no best checkpoint: checkpoint=RUN_DIR takes its newest"
    assert "-1" not in text and "BLEU" not in text
    no_dev = dataclasses.replace(cfg, data=DataConfig(name="files", train_src=files["train_src"]))
    (tmp_path / "mine" / "checkpoints" / "step_10").mkdir()
    for step in (5, 10):
        (tmp_path / "mine" / "checkpoints" / f"step_{step}" / "meta.json").write_text("{}")
    text = what_comes_next(no_dev, TrainState(step=10))
    assert "    mt-evaluate checkpoint=mine data=files data.train_src=c/train.it test_set=dev" in text
    assert "    mt-average mine --last 2 -o mine/checkpoints/avg_last2" in text


def test_config_yaml_records_the_vocabulary_in_effect(tmp_path):
    """The run's config.yaml holds the model's vocabulary size and special ids as its
    tokenizer decided them (the checkpoints' model.json), not the composed default."""
    trainer = run(tmp_path / "run", "trainer.max_steps=2")
    assert compose_cfg(*DEBUG).model.vocab_size != trainer.model.cfg.vocab_size
    for where in (tmp_path / "run", tmp_path / "run" / "checkpoints" / "step_2"):
        saved = OmegaConf.load(where / "config.yaml")
        assert saved.model.vocab_size == trainer.model.cfg.vocab_size == trainer.tokenizer.vocab_size
        assert (saved.model.pad_id, saved.model.eos_id) == (trainer.tokenizer.pad_id, trainer.tokenizer.eos_id)


def _experiments() -> list[str]:
    return sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("name", _experiments())
def test_every_experiment_composes_into_a_valid_config(name):
    cfg = to_dataclass(TrainConfig, compose_cfg(f"experiment={name}"))
    assert cfg.trainer.run_dir.endswith(name)


def test_debug_config_composes_with_a_tiny_model():
    cfg = to_dataclass(TrainConfig, compose_cfg("debug=default"))
    assert cfg.model.d_model <= 64 and cfg.trainer.device == "cpu"


def test_command_line_overrides_reach_the_dataclasses():
    cfg = to_dataclass(TrainConfig, compose_cfg("model=base", "trainer.precision=bf16", "optim.lr=5e-4"))
    assert (cfg.model.d_model, cfg.trainer.precision, cfg.optim.lr) == (512, "bf16", 5e-4)


def test_unknown_keys_and_wrong_types_fail_before_anything_runs():
    with pytest.raises(Exception, match="lrr"):
        compose_cfg("optim.lrr=1")
    with pytest.raises(ConfigCompositionException, match="max_steps") as info:  # the groups are typed
        compose_cfg("trainer.max_steps=many")
    assert isinstance(info.value.__cause__, ValidationError)
    bad = OmegaConf.to_container(compose_cfg())  # e.g. a typo in a model yaml
    bad["model"]["d_modle"] = 3
    with pytest.raises(ConfigKeyError, match="d_modle"):
        to_dataclass(TrainConfig, bad)
    bad = OmegaConf.to_container(compose_cfg())
    bad["trainer"]["max_steps"] = "many"
    with pytest.raises(ValidationError, match="max_steps"):
        to_dataclass(TrainConfig, bad)


@pytest.mark.parametrize("where", ["run", "new/deeper/run"])
def test_a_refused_run_leaves_no_folder_behind(tmp_path, where):
    """A setting refused after the run directory was opened (fp16 on a CPU) removes the
    folders opening it made; a folder that was there stays, with what it held."""
    from transformer.errors import UserError

    with pytest.raises(UserError, match=r"trainer\.precision=fp16"):
        run(tmp_path / where, "trainer.precision=fp16", "trainer.device=cpu")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "mine").mkdir()
    with pytest.raises(UserError, match=r"trainer\.precision=fp16"):
        run(tmp_path / "mine", "trainer.precision=fp16", "trainer.device=cpu")
    assert (tmp_path / "mine").is_dir()


def test_a_refused_console_run_leaves_no_folder_behind(tmp_path):
    """The same through the console command, where Hydra makes the run directory before
    mt-train opens it: the folders are its own, and go."""
    from helpers import shared_cache

    cmd = [sys.executable, "-m", "transformer.commands.train", *DEBUG, "trainer.precision=fp16",
           "trainer.device=cpu", f"trainer.run_dir={tmp_path / 'new' / 'deeper' / 'run'}",
           f"data.cache_dir={shared_cache()}"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "trainer.precision=fp16" in proc.stderr, proc.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []
