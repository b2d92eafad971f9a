"""A hyper-parameter study over `mt-train` runs: `mt-train -m hparams_search=<name>`.

Hydra's Optuna sweeper (the `tune` extra: `pip install -e ".[tune]"`) asks Optuna for a
trial's settings, runs them as one sweep job of `mt-train`, in its own run directory named
after them (configs/train.yaml), and tells Optuna what the job returned: `trial_score`.
`configs/hparams_search/*.yaml` describe the studies: search space, sampler, the budget
of a trial, where the study is stored.

The study lives in a database (SQLite under the sweep directory), so that running the same
command again resumes it. `ResumeStudy`, a Hydra callback the study configs name, makes
that exact, where the sweeper alone would not be:
- `hydra.sweeper.n_trials` is the study's total: the sweeper runs that many *more* on every
  invocation, so the callback lowers it to the trials still missing;
- a trial the stopped study left running (Ctrl-C, a killed process) is marked failed and
  its settings are asked again first: the same settings name the same run directory, so
  the trial continues from its last checkpoint instead of starting over.
One `mt-train -m` at a time may run a study (a second one would take the first one's
running trials for stale).
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, open_dict, read_write

from transformer.commands import cli
from transformer.config import ConfigError
from transformer.errors import UserError, file_error
from transformer.training.nan_guard import TrainingDiverged

if TYPE_CHECKING:  # a trial returns the Trainer it ran
    from transformer.training.trainer import Trainer

log = logging.getLogger(__name__)

# What a diverged trial scores: the BLEU of a model that translates nothing. A number, not
# a failure: Optuna leaves failed trials out of TPE's model, which would keep sampling the
# learning rates that diverge; a score of 0 teaches it to avoid them, and the study goes on.
DIVERGED_SCORE = 0.0


def trial_score(train: Callable[[], Trainer]) -> float:
    """Run one trial (`train`) and return its objective: the run's best selection score
    (`Validator.selection_score`: the dev BLEU, or the mean over the dev sets of a mix).

    The best, not the last validation's, because it is kept in the training state: a
    trial asked again (the same settings, the same run directory) resumes a finished run
    and returns its score without training; and it is the checkpoint a recipe ships
    (`checkpoints/best`). The study configs validate once, at the end of the trial's
    budget (`trainer.val_every` beyond it), so there the best is the final weights' score
    and no trial gains from the noise of several looks at the dev set.

    A trial that diverges scores DIVERGED_SCORE, with one line in the log; one that was
    interrupted (SIGINT/SIGTERM: it saved a checkpoint) stops the study, which a rerun
    of the command resumes, continuing this trial.
    """
    try:
        trainer = train()
    except TrainingDiverged as e:
        log.warning("%s; the trial scores %s and the sweep goes on", e, DIVERGED_SCORE)
        return DIVERGED_SCORE
    if trainer.stop_signal is not None:
        raise KeyboardInterrupt
    return trainer.state.best_bleu


def join_submitit_tasks() -> None:
    """Describe a trial's process group the way `torchrun` does, where the trial is a
    submitit job of several tasks (`hydra.launcher.tasks_per_node=N`, one per GPU): then
    `mt-train` trains it with DDP, rank 0 validating and returning the score (the one
    Hydra's submitit launcher reads). Nothing changes outside such a job, or under
    `torchrun`. Each process keeps every GPU in sight and takes cuda:LOCAL_RANK."""
    if "RANK" in os.environ:
        return
    try:
        import submitit
    except ImportError:  # no tune extra: not a submitit job
        return
    try:
        tasks = submitit.JobEnvironment().num_tasks
    except RuntimeError:  # not inside a submitit or Slurm job
        return
    if tasks > 1:
        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)


class ResumeStudy(Callback):
    """Hydra callback (`hydra.callbacks`) of a study config: before the sweeper starts,
    make the sweep directory (the SQLite file's home), re-ask the trials a stopped study
    left running, and set `hydra.sweeper.n_trials` to the trials the study still lacks.

    The sampler's seed is offset by the trials the study holds: with the same seed, a
    resumed study would draw its first random trials again (TPE starts at random).
    """

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # Hydra turns a callback's exception into a warning and sweeps on: a user's mistake
        # (n_trials=0, a storage that cannot be opened or written) ends the command here.
        try:
            self._start(config)
        except UserError as e:
            sys.exit(f"mt-train: error: {cli.error_message(e)}")

    def _start(self, config: DictConfig) -> None:
        cli.setup_logging()
        sweeper = config.hydra.sweeper
        n_trials = sweeper.get("n_trials")
        if not isinstance(n_trials, int) or n_trials < 1:
            raise ConfigError(f"hydra.sweeper.n_trials={n_trials}: must be >= 1 (the study's "
                              "total number of trials)")
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            sweep_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise file_error(e, sweep_dir, "make the sweep directory", "trainer.run_dir") from e
        if not (sweeper.get("storage") and sweeper.get("study_name")):
            return  # a study kept in memory, or under a new random name: nothing to resume
        open_study(sweeper.storage, sweeper.study_name, sweeper.get("direction", "minimize"))
        done, held = resume_study(sweeper.storage, sweeper.study_name)
        to_go = max(0, sweeper.n_trials - done)
        log.info("study %s: %d of %d trials done, %d to go", sweeper.study_name, done,
                 sweeper.n_trials, to_go)
        with read_write(config.hydra), open_dict(config.hydra):
            sweeper.n_trials = to_go
            if held and sweeper.get("sampler") is not None and sweeper.sampler.get("seed") is not None:
                sweeper.sampler.seed += held


def open_study(storage: str, study_name: str, direction: Any) -> None:
    """Open (or create) the study and write to it once, before any trial: a storage URL
    that names no database, a driver that is not installed, a database that cannot be
    written are one line (ConfigError) here, instead of a traceback mid-sweep."""
    import optuna  # the tune extra: imported only where a study is run
    from sqlalchemy.exc import SQLAlchemyError

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    directions = [direction] if isinstance(direction, str) else list(direction)
    try:
        study = optuna.create_study(study_name=study_name, storage=storage,
                                    directions=[str(d) for d in directions], load_if_exists=True)
        study.set_user_attr("mt_train_opened", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    except (SQLAlchemyError, optuna.exceptions.StorageInternalError, ImportError, ValueError,
            OSError) as e:
        cause = e.__cause__ if isinstance(e, optuna.exceptions.StorageInternalError) and e.__cause__ else e
        why = " ".join(str(cause).split("(Background on this error")[0].split(" [SQL:")[0].split())
        e = cause
        raise ConfigError(f"hydra.sweeper.storage={storage}: cannot open or write the study's "
                          f"database ({type(e).__name__}: {why[:300]})") from e


def resume_study(storage: str, study_name: str) -> tuple[int, int]:
    """Prepare a stored study to continue; returns its finished trials (complete or
    pruned) and all the trials it holds (0, 0 for a study not made yet). Each trial left
    running is marked failed and its settings are queued: the sweeper's next trial is
    that one again."""
    import optuna  # the tune extra: imported only where a study is run
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)  # the SQLite schema's set-up, line by line
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:  # no such study yet: the sweeper creates it
        return 0, 0
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(trial.number, state=TrialState.FAIL)
        with warnings.catch_warnings():  # enqueue_trial is "experimental" in optuna 2
            warnings.simplefilter("ignore")
            study.enqueue_trial(trial.params)
        log.info("trial %d was left running by a stopped study: asked again, %s", trial.number,
                 trial.params)
    finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    return len(finished), len(study.get_trials(deepcopy=False))
