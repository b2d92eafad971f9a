"""scripts/studies/study_table.py: a study's trials as a table, best first, from their run directories."""

import importlib.util
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from torch.utils.tensorboard import SummaryWriter

from helpers import compose_cfg

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "studies" / "study_table.py"


def _load():
    spec = importlib.util.spec_from_file_location("study_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _trial(run_dir: Path, lr: float, bleu: tuple[float, float] | None, step: int = 400) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(
        "model: {n_encoder_layers: 6, n_decoder_layers: 2, d_model: 256, d_ff: 1024, dropout: 0.0}\n"
        f"optim: {{lr: {lr}, warmup_steps: 500, label_smoothing: 0.1}}\n"
        "data: {max_tokens: 4096, spm_vocab_size: 8000, corpora: {europarl: 1.0, tatoeba: 3.0},"
        " phases: [{epochs: 2, corpora: {tatoeba: 1.0}}]}\n")
    (run_dir / "train.log").write_text("2026-11-24 INFO transformer.commands.train: precision: bf16 (auto: ...)\n")
    meta = run_dir / "checkpoints" / f"step_{step}" / "meta.json"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"step": step, "train_seconds": 1500.0}))
    w = SummaryWriter(str(run_dir / "tb"))
    w.add_scalar("train/loss", 3.0, step)
    if bleu is not None:
        for name, value in zip(("europarl", "tatoeba"), bleu, strict=True):
            w.add_scalar(f"dev/{name}/bleu", value, step)
            w.add_scalar(f"dev/{name}/name_copy", 40.0, step)
        w.add_scalar("dev/bleu", sum(bleu) / 2, step)
    w.close()


def test_trials_are_listed_best_first_with_their_settings_and_scores(tmp_path):
    table = _load()
    _trial(tmp_path / "a", 1e-3, (10.0, 40.0))
    _trial(tmp_path / "b", 2e-3, (14.0, 50.0))
    _trial(tmp_path / "c", 4e-3, None, step=250)  # still training
    rows = table.best_first([table.trial_row(tmp_path / d) for d in "abc"])
    assert [r["lr"] for r in rows] == ["0.002", "0.001", "0.004"]
    assert rows[0]["layers"] == "6/2" and rows[0]["Tatoeba-first epochs"] == "2" and rows[0]["precision"] == "bf16"
    assert rows[0]["scores"] == {"europarl": (14.0, 40.0), "tatoeba": (50.0, 40.0)} and rows[0]["mean"] == 32.0
    text = table.markdown(rows)
    assert "| 1 | 6/2 |" in text and "14.0 / 40.0" in text and "32.00" in text and text.endswith("training |")


def test_rows_name_their_optuna_trials_a_retried_trial_sharing_its_first_attempts_row(tmp_path):
    optuna = pytest.importorskip("optuna")
    from optuna.distributions import CategoricalDistribution  # in optuna 2 and 3
    from optuna.trial import TrialState, create_trial

    table = _load()
    _trial(tmp_path / "a", 1e-3, (10.0, 40.0))
    _trial(tmp_path / "b", 0.0011180771903422713, (14.0, 50.0))
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    lr = {"optim.lr": CategoricalDistribution((1e-3, 0.0011180771903422713))}
    study.add_trial(create_trial(params={"optim.lr": 1e-3}, distributions=lr, value=25.0))
    study.add_trial(create_trial(params={"optim.lr": 0.0011180771903422713}, distributions=lr,
                                 state=TrialState.FAIL))  # stopped, asked again as trial 2
    study.add_trial(create_trial(params={"optim.lr": 0.0011180771903422713}, distributions=lr, value=32.0))
    runs = [tmp_path / "a", tmp_path / "b"]
    rows = [table.trial_row(d) for d in runs]
    table.trial_numbers(storage, "s", rows)
    assert [r["trials"] for r in rows] == ["0", "1, 2"]
    assert "| rank | Optuna trial | layers |" in table.markdown(rows)
    assert "| rank | layers |" in table.markdown([table.trial_row(d) for d in runs])  # no storage
    with pytest.raises(SystemExit, match="no study 'other'"):
        table.trial_numbers(storage, "other", rows)


def test_a_trial_command_composes_the_trials_config_with_the_overrides_on_top(tmp_path):
    """--command's overrides are the property that matters: a fresh `mt-train` composes from
    them exactly the trial's config.yaml, its run directory and the keys given aside."""
    import yaml

    table = _load()
    sampled = ["model.n_encoder_layers=6", "model.n_decoder_layers=2", "model.dropout=0.0",
               "optim.lr=0.0007925851919632147", "data.corpora.tatoeba=4.0", "data.epoch_pairs=100000",
               "data.phases=[{epochs: 4, corpora: {tatoeba: 1.0}}]", "trainer.max_hours=0.42",
               "trainer.run_dir='runs/search/s/trial~1'", r"data.tokenizer='it\'s here/spm.model'", "data.cache_dir='2026'",
               "trainer.device='null'"]
    trial = OmegaConf.to_container(compose_cfg("experiment=europarl_tatoeba_cpu", *sampled), resolve=True)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "config.yaml").write_text(yaml.safe_dump(trial))
    extra = ["trainer.max_hours=2", "trainer.run_dir=runs/confirm/t"]
    overrides = table.trial_overrides(table.trial_row(tmp_path / "t"), "europarl_tatoeba_cpu", extra)
    assert overrides[0] == "experiment=europarl_tatoeba_cpu" and overrides[-2:] == extra
    assert not any(o.startswith(("trainer.max_hours=0.42", "trainer.run_dir=runs/search")) for o in overrides)
    again = OmegaConf.to_container(compose_cfg(*overrides), resolve=True)
    assert again["trainer"].pop("max_hours") == 2 and again["trainer"].pop("run_dir") == "runs/confirm/t"
    del trial["trainer"]["max_hours"], trial["trainer"]["run_dir"]
    assert again == trial and again["data"]["tokenizer"] == "it's here/spm.model"
    assert again["data"]["cache_dir"] == "2026" and again["trainer"]["device"] == "null"  # strings, quoted


def test_a_trial_command_refuses_a_config_with_keys_the_schema_lost_and_an_unknown_trial(tmp_path):
    table = _load()
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "config.yaml").write_text("model: {d_model: 256, gone: 1}\n")
    with pytest.raises(SystemExit, match=r"config.yaml: keys the config schema no longer has: model.gone"):
        table.trial_overrides(table.trial_row(tmp_path / "t"), "europarl_tatoeba_cpu", [])
    rows = [{"trials": "1, 17", "run_dir": tmp_path / "t"}]
    with pytest.raises(SystemExit, match="no run directory holds the settings of trial 7"):
        table.row_of(7, rows)
    assert table.row_of(17, rows) is rows[0]
    assert table.study_experiment(Path("runs/search/europarl_tatoeba_cpu")) == "europarl_tatoeba_cpu"
