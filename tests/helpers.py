"""What several test modules share: composing the real configs and short debug training runs."""

from __future__ import annotations

import os
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from transformer.config import CONFIG_DIR, TrainConfig, to_dataclass
from transformer.train import train
from transformer.trainer import Trainer

# The debug preset on the shipped sample corpus: a tiny model, 20 CPU steps, no bar.
DEBUG = ["debug=default", "data=sample", "trainer.progress=false", "trainer.num_threads=1"]


def shared_cache() -> Path:
    """One prepared-data cache for the whole test session (conftest.py sets it): entries are
    keyed by the corpus files and every setting that shapes them, so tests that prepare
    the same data reuse it and tests that prepare other data do not see it."""
    return Path(os.environ["MT_TEST_DATA_CACHE"])


def compose_cfg(*overrides: str, config: str = "train") -> DictConfig:
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config, overrides=list(overrides))


def run(run_dir: Path, *overrides: str) -> Trainer:
    """A debug training run into run_dir (prepared data from the session's shared cache)."""
    cfg = compose_cfg(*DEBUG, f"trainer.run_dir={run_dir}", f"data.cache_dir={shared_cache()}",
                      *overrides)
    return train(to_dataclass(TrainConfig, cfg), OmegaConf.to_yaml(cfg))


def scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of every event of `tag`, in the order they were written.

    EventAccumulator reads a run's event files in name order, and the names end with a
    per-process counter: a resumed run's file `...<time>.<pid>.10` written in the same second
    as `...<time>.<pid>.9` would be read first. So the events are put in time order.
    """
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return [(e.step, e.value) for e in sorted(acc.Scalars(tag), key=lambda e: e.wall_time)]
