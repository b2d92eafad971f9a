"""Optuna studies (`mt-train -m hparams_search=...`): every point of a search space is a
valid run, a study stores its trials, resumes without rerunning them, asks a stopped trial
again, scores a diverged trial 0 and goes on, and runs its trials under submitit_local."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from transformer.commands.cli import _dirname
from transformer.commands.overrides import rewrite
from transformer.commands.sweep import DIVERGED_SCORE, ResumeStudy, trial_score
from transformer.config import TrainConfig, to_dataclass
from transformer.paths import CONFIG_DIR, PROJECT_ROOT
from transformer.training.nan_guard import TrainingDiverged

from helpers import DEBUG, compose_cfg, shared_cache

STUDIES = sorted(p.stem for p in (CONFIG_DIR / "hparams_search").glob("*.yaml"))


def test_a_trial_scores_its_best_bleu_zero_if_it_diverged_and_stops_the_study_if_interrupted():
    done = SimpleNamespace(state=SimpleNamespace(best_bleu=12.5), stop_signal=None)
    assert trial_score(lambda: done) == 12.5

    def diverges():
        raise TrainingDiverged("training diverged after update 1")

    assert trial_score(diverges) == DIVERGED_SCORE == 0.0
    interrupted = SimpleNamespace(state=SimpleNamespace(best_bleu=3.0), stop_signal=2)
    with pytest.raises(KeyboardInterrupt):  # recorded as nothing: a rerun resumes the trial
        trial_score(lambda: interrupted)


def test_long_job_names_keep_their_difference():
    """Hydra names a sweep job's directory after its overrides; an Optuna trial's dozen
    settings run past the 200 characters kept, where two trials may differ."""
    a, b = "model.d_model=256," * 12 + "optim.lr=0.001", "model.d_model=256," * 12 + "optim.lr=0.002"
    assert len(_dirname(a)) == len(_dirname(b)) == 200 and _dirname(a) != _dirname(b)
    assert _dirname(a)[:187] == a[:187] and _dirname("data.root=/x/y") == "data.root=_x_y"


def test_a_jobs_directory_is_named_after_the_overrides_as_typed():
    """`overrides.rewrite` makes `~optim.betas` and a replaced mix `key='???'` (a typed
    group cannot lose a key); the job's directory keeps the name the typed override gave
    it before, so an old sweep resumes into its directories."""
    typed = ["data=europarl_tatoeba", "data.corpora={europarl: 2, tatoeba: 1}", "optim.lr=0.001"]
    cfg = compose_cfg(*rewrite(typed, TrainConfig), return_hydra_config=True)
    assert cfg.data.corpora == {"europarl": 2.0, "tatoeba": 1.0}
    before = ["data=europarl_tatoeba", "~data.corpora=null", "++data.corpora={europarl: 2, tatoeba: 1}",
              "optim.lr=0.001"]  # what rewrite made of them when a mix could be deleted
    assert _dirname(cfg.hydra.job.override_dirname) == ",".join(sorted(before))
    cfg = compose_cfg(*rewrite(["model.d_model=128", "~optim.betas", "~data.phases"], TrainConfig),
                      return_hydra_config=True)
    assert _dirname(cfg.hydra.job.override_dirname) == "model.d_model=128,~data.phases=null,~optim.betas=null"


def test_a_real_sweep_names_its_jobs_directory_as_the_flat_package_did(tmp_path):
    """Hydra's sweeper writes a deletion `~key` as `~key=null`; the name below is the one
    the flat package's `mt-train -m` (b005d97) gave this job, so a sweep started then
    resumes into its directories. The job itself is refused (a mix needs data=mix), after
    Hydra made its directory: no training is needed to see the name."""
    proc = subprocess.run(
        ["mt-train", "-m", *DEBUG, f"trainer.run_dir={tmp_path}", f"data.cache_dir={shared_cache()}",
         "trainer.max_steps=2", "~optim.betas", "optim.lr=1e-3", "data.corpora={sample: 1}"],
        capture_output=True, text=True, timeout=300)
    assert "only for data.name=mix" in proc.stderr
    jobs = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert jobs == ["++data.corpora={sample:1},data=sample,debug=default,optim.lr=0.001,trainer.max_steps=2,"
                    "~data.corpora=null,~optim.betas=null"]


optuna = pytest.importorskip("optuna", reason="the tune extra: pip install -e '.[tune]'")
_impl = pytest.importorskip("hydra_plugins.hydra_optuna_sweeper._impl")


def study_config(name: str, *overrides: str):
    return compose_cfg(f"hparams_search={name}", *overrides, return_hydra_config=True)


def search_space(name: str) -> dict:
    """The study's parameters as Optuna distributions, as the sweeper makes them."""
    params = study_config(name).hydra.sweeper.params
    return _impl.create_params_from_overrides([f"{k}={v}" for k, v in params.items()])[0]


def points(distribution) -> list:
    """A categorical's choices, an interval's ends."""
    return list(getattr(distribution, "choices", None) or (distribution.low, distribution.high))


@pytest.mark.parametrize("name", STUDIES)
def test_every_point_of_a_search_space_is_a_valid_run(name):
    space = search_space(name)
    assert space, f"{name} searches nothing"
    for key, distribution in space.items():
        for value in points(distribution):
            cfg = study_config(name, f"{key}={value}")
            to_dataclass(TrainConfig, {k: v for k, v in cfg.items() if k != "hydra"})
    corners = [[f"{k}={f(points(d))}" for k, d in space.items()] for f in (min, max)]
    for overrides in corners:  # everything smallest, everything largest together
        cfg = study_config(name, *overrides)
        to_dataclass(TrainConfig, {k: v for k, v in cfg.items() if k != "hydra"})
    sweeper = study_config(name).hydra.sweeper
    assert sweeper.direction == "maximize" and sweeper.storage.endswith("/optuna.db")
    assert sweeper.storage == f"sqlite:///{study_config(name).hydra.sweep.dir}/optuna.db"


# --- studies run as a user runs them: the command, in a fresh process -------------------


def mt_train(cwd: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "transformer.commands.train", "-m", "hparams_search=sample",
           "trainer.precision=fp32", "trainer.num_threads=1", f"data.cache_dir={shared_cache()}",
           f"trainer.run_dir={cwd / 'study'}", *overrides]
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def trials(cwd: Path) -> list:
    study = optuna.load_study(study_name="sample", storage=f"sqlite:///{cwd / 'study' / 'optuna.db'}")
    return study.get_trials(deepcopy=False)


def trial_dirs(cwd: Path) -> list[Path]:
    return sorted(p for p in (cwd / "study").iterdir() if p.is_dir() and not p.name.startswith("."))


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """A finished two-trial study of configs/hparams_search/sample.yaml (4 updates a trial)."""
    cwd = tmp_path_factory.mktemp("study")
    mt_train(cwd)
    return cwd


def copy_study(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def test_a_study_stores_its_trials_each_in_its_own_run_directory(study):
    done = trials(study)
    assert [t.state.name for t in done] == ["COMPLETE", "COMPLETE"]
    assert all(t.value >= 0 for t in done)
    dirs = trial_dirs(study)
    assert len(dirs) == 2 and (study / "study" / "optimization_results.yaml").is_file()
    for t in done:  # each trial's directory is named after its settings and holds its run
        (job,) = [d for d in dirs if f"optim.lr={t.params['optim.lr']}" in d.name]
        assert f"model.n_decoder_layers={t.params['model.n_decoder_layers']}" in job.name
        assert (job / "checkpoints" / "step_4").is_dir() and (job / "checkpoints" / "best").is_dir()


def test_a_study_run_again_keeps_its_trials_and_runs_only_those_it_lacks(study, tmp_path):
    cwd = copy_study(study, tmp_path / "again")
    before = {t.number: (t.params, t.value, t.datetime_complete) for t in trials(cwd)}
    stamps = {d.name: (d / "checkpoints" / "step_4" / "model.safetensors").stat().st_mtime_ns
              for d in trial_dirs(cwd)}
    proc = mt_train(cwd)  # n_trials is the study's total: two done, none to go
    assert "study sample: 2 of 2 trials done, 0 to go" in proc.stderr
    assert len(trials(cwd)) == 2 and "Launching" not in proc.stderr
    proc = mt_train(cwd, "hydra.sweeper.n_trials=3")
    assert "2 of 3 trials done, 1 to go" in proc.stderr
    after = trials(cwd)
    assert [t.state.name for t in after] == ["COMPLETE"] * 3
    assert {t.number: (t.params, t.value, t.datetime_complete) for t in after[:2]} == before
    assert after[2].params not in [p for p, _, _ in before.values()]  # a new point, not a replay
    assert len(trial_dirs(cwd)) == 3
    for d in trial_dirs(cwd):  # the finished trials' runs were not touched
        if d.name in stamps:
            assert (d / "checkpoints" / "step_4" / "model.safetensors").stat().st_mtime_ns == stamps[d.name]


def test_a_trial_left_running_is_asked_again_and_continues_its_run(study, tmp_path):
    """A study stopped mid-trial (Ctrl-C, a killed process) leaves the trial RUNNING in the
    database. The next invocation marks it failed and asks its settings again: the same
    run directory, so the run resumes from its checkpoint (here: already at its end)."""
    cwd = copy_study(study, tmp_path / "stopped")
    storage = f"sqlite:///{cwd / 'study' / 'optuna.db'}"
    stored = optuna.load_study(study_name="sample", storage=storage)
    first = stored.trials[0]
    with warnings.catch_warnings():  # "experimental" in optuna 2
        warnings.simplefilter("ignore")
        stored.enqueue_trial(first.params)
        stale = stored.ask()  # what the sweeper had asked when it stopped
    stale.suggest_float("optim.lr", 1e-3, 1e-2, log=True)
    stale.suggest_categorical("model.n_decoder_layers", [1, 2])
    proc = mt_train(cwd, "hydra.sweeper.n_trials=3")
    assert "trial 2 was left running by a stopped study: asked again" in proc.stderr
    after = trials(cwd)
    assert [t.state.name for t in after] == ["COMPLETE", "COMPLETE", "FAIL", "COMPLETE"]
    assert after[3].params == after[2].params == first.params and after[3].value == first.value
    assert "resumed from" in proc.stderr and len(trial_dirs(cwd)) == 2


def test_a_diverging_trial_scores_zero_and_the_study_goes_on(tmp_path):
    proc = mt_train(tmp_path, "optim.lr=1e10")
    assert proc.stderr.count("the trial scores 0.0 and the sweep goes on") == 2
    assert [(t.state.name, t.value) for t in trials(tmp_path)] == [("COMPLETE", 0.0)] * 2


@pytest.mark.slow  # 17 s: a process per trial, each importing torch
def test_submitit_local_runs_each_trial_in_a_process_of_its_own(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    proc = mt_train(tmp_path, "hydra/launcher=submitit_local")
    assert "Submitit 'local' sweep output dir" in proc.stderr
    assert [t.state.name for t in trials(tmp_path)] == ["COMPLETE", "COMPLETE"]
    jobs = [p.name for p in (tmp_path / "study" / ".submitit").iterdir() if p.name.isdigit()]
    assert len(set(jobs)) == 2  # a local job's id is its process id: a process per trial
    for d in trial_dirs(tmp_path):
        assert (d / "checkpoints" / "step_4").is_dir()


@pytest.mark.slow  # 20 s: two processes per trial
def test_a_trial_of_two_submitit_tasks_trains_them_as_one_ddp_run(tmp_path):
    """`hydra.launcher.tasks_per_node=2`: both tasks join one process group (gloo on CPU,
    as torchrun would set it up); two rank-0 runs would collide on the run directory's
    lock instead, and the trial would fail."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    mt_train(tmp_path, "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2",
             "hydra.sweeper.n_trials=1")
    (trial,) = trials(tmp_path)
    assert trial.state.name == "COMPLETE" and trial.value >= 0
    (job,) = [p for p in (tmp_path / "study" / ".submitit").iterdir() if p.name.isdigit()]
    logs = sorted(f.name for f in job.glob("*_log.err"))
    assert logs == [f"{job.name}_0_log.err", f"{job.name}_1_log.err"]
    assert "in use by another mt-train" not in (job / logs[1]).read_text()
    (run,) = trial_dirs(tmp_path)
    assert (run / "checkpoints" / "step_4").is_dir()


@pytest.mark.parametrize(("sweeper", "line"), [
    ({"n_trials": 0}, "mt-train: error: hydra.sweeper.n_trials=0: must be >= 1"),
    ({"storage": "garbage://x"}, "mt-train: error: hydra.sweeper.storage=garbage://x: cannot open or write "
     "the study's database (NoSuchModuleError: Can't load plugin: sqlalchemy.dialects:garbage)"),
    ({"storage": "sqlite:///{tmp}/missing/dir/optuna.db"}, "unable to open database file"),
    ({"storage": "sqlite:///file:{tmp}/ro.db?mode=ro&uri=true"}, "attempt to write a readonly database"),
], ids=["n_trials=0", "garbage", "missing-dir", "read-only"])
def test_a_study_that_cannot_start_says_so_in_one_line(tmp_path, sweeper, line):
    """Hydra turns a callback's exception into a warning and sweeps on, into a traceback of
    a hundred lines: the callback ends the command itself, before any trial."""
    (tmp_path / "ro.db").write_bytes(b"")
    settings = {"n_trials": 2, "study_name": "s", "direction": "maximize",
                "storage": f"sqlite:///{tmp_path}/optuna.db"} | sweeper
    settings["storage"] = settings["storage"].format(tmp=tmp_path)
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "sweep")}, "sweeper": settings}})
    with pytest.raises(SystemExit) as info:
        ResumeStudy().on_multirun_start(config)
    assert line in info.value.code and "\n" not in info.value.code
