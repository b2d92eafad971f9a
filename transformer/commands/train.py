"""`mt-train`: train a translation model; one run, or a sweep of several (also
`python -m transformer.commands.train`).

    mt-train experiment=tatoeba_cpu
    mt-train model=base trainer.precision=bf16 optim.lr=7e-4
    mt-train -m hparams_search=europarl_tatoeba_cpu        # an Optuna study (transformer/commands/sweep.py)
    torchrun --nproc_per_node=2 -m transformer.commands.train experiment=iwslt2017_base
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import datasets
import hydra
import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from transformer.checkpoint import CheckpointError, load_meta, load_model, step_checkpoints
from transformer.commands import cli, sweep
from transformer.config import DataConfig, ModelConfig, TrainConfig, to_dataclass
from transformer.data.pipeline import prepare_data
from transformer.device import (
    enable_fast_cuda_math,
    keep_large_blocks_in_the_heap,
    resolve_precision,
)
from transformer.errors import writing
from transformer.model.transformer import build_model, count_parameters
from transformer.paths import USER_PATH_KEYS, user_path
from transformer.training import finetune
from transformer.training.distributed import seed_everything, setup_distributed
from transformer.training.run_dir import (
    RunDir,
    check_resumable,
    open_run_dir,
    remove_new_empty_dirs,
)
from transformer.training.state import TrainState
from transformer.training.trainer import Trainer

log = logging.getLogger(__name__)
_started: float | None = None  # when main() began: before Hydra made the run directory


def train(cfg: TrainConfig, run_config_yaml: str, made_since: float | None = None) -> Trainer:
    """Run training as described by cfg; returns the trainer (its model and final state).

    Every check that can fail on the user's settings runs before the data is prepared:
    the run directory (lock, leftovers, whose checkpoints), the model config against the
    checkpoint resumed, the precision on this device. `made_since`: when the command
    began, for a run directory Hydra may have made since (`run_dir.open_run_dir`); None:
    the directory is the run's own only where it was missing.
    """
    parent = None
    if cfg.trainer.init_from:  # checked before anything is made: a refused run leaves nothing
        parent = finetune.parent_checkpoint(cfg.trainer.init_from, cfg.trainer.resume)
        finetune.check_tokenizer_setting(cfg.trainer.init_from, cfg.data.tokenizer)
        finetune.check_architecture(parent, cfg.model)
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, tokenizer=str(parent)))
    dist_info, device = setup_distributed(cfg.trainer.device)
    cli.setup_logging(is_main=dist_info.is_main)
    # Rank 0 tidies the run directory (leftovers of a crash) and decides what the run
    # continues from; the others take its decision (tidying removes evidence that decision
    # reads, so they cannot make it again). If it refuses to start, torchrun stops them.
    if dist_info.is_main:
        run = open_run_dir(cfg.trainer.run_dir, cfg.trainer.resume, is_main=True, made_since=made_since)
        log.info("run directory: %s", shown(run.path))
    if dist_info.world_size > 1:
        decided = [[str(p) for p in run.resume_from], sorted(run.owned)] if dist_info.is_main else [None, None]
        dist.broadcast_object_list(decided, src=0)
        if not dist_info.is_main:
            run = RunDir(Path(cfg.trainer.run_dir), [Path(p) for p in decided[0]], set(decided[1]))
    try:
        cli.setup_logging(log_file=run.path / "train.log", is_main=dist_info.is_main)
        if dist.is_initialized():
            log.info("distributed: %s backend, %d process(es), this one rank %d on %s",
                     dist.get_backend(), dist_info.world_size, dist_info.rank, device)
        _check_model_config(run, cfg)
        precision, why = resolve_precision(cfg.trainer.precision, device)
        log.info("precision: %s (%s)", precision, why)
        cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, precision=precision))
        return _train(cfg, run_config_yaml, run, dist_info, device, parent)
    except BaseException:
        if dist_info.is_main:  # refused or stopped before writing: the folder it made goes
            run.remove_if_unused()
        raise
    finally:
        run.close()


def _check_model_config(run: RunDir, cfg: TrainConfig) -> None:
    """Compare with the first readable checkpoint resumed (an unreadable one is skipped
    here and, with a warning, by the trainer)."""
    for candidate in run.resume_from:
        try:
            check_resumable(candidate, cfg.model)
            return
        except CheckpointError:
            continue


def _train(cfg: TrainConfig, run_config_yaml: str, run: RunDir, dist_info, device,
           parent: Path | None) -> Trainer:
    if device.type == "cuda":
        enable_fast_cuda_math()
    elif cfg.trainer.num_threads:
        torch.set_num_threads(cfg.trainer.num_threads)
    if not (cfg.trainer.progress and dist_info.is_main):
        datasets.disable_progress_bars()  # the encoding bars too, in a log file under nohup
    # Rank 0 builds the vocabulary and encoded corpus first; the others then hit its cache.
    if not dist_info.is_main:
        dist.barrier()
    data = prepare_data(cfg.data)
    if dist_info.is_main and dist_info.world_size > 1:
        dist.barrier()
    if device.type == "cpu":  # after the data: preparing it must not leave its peak behind
        keep_large_blocks_in_the_heap()
    tok = data.tokenizer
    model_cfg = dataclasses.replace(cfg.model, vocab_size=tok.vocab_size, pad_id=tok.pad_id,
                                    bos_id=tok.bos_id, eos_id=tok.eos_id)
    run_config_yaml = with_model(run_config_yaml, model_cfg)  # config.yaml: the vocabulary in effect
    seed_everything(cfg.trainer.seed)  # the same initial weights on every rank
    model = build_model(model_cfg).to(device)
    if parent is not None and not run.resume_from:  # a fine-tuning run's start; later, its own
        model.load_state_dict(load_model(parent)[0].state_dict())
        log.info("fine-tuning from %s (its step %s): its weights, a fresh optimizer and schedule",
                 parent, load_meta(parent).get("step", "?"))
    log.info("model: %s parameters, %s", f"{count_parameters(model):,}", model_cfg)
    log.info("data: %s, %d training pairs, %s, vocabulary %d", cfg.data.describe(), len(data.train),
             ", ".join(f"{len(ds)} {name} dev pairs" for name, ds in data.devs.items()), tok.vocab_size)
    trainer = Trainer(dataclasses.replace(cfg, model=model_cfg), run_config_yaml, data, model,
                      device, dist_info, owned=run.owned)
    trainer.resume(run.resume_from)
    if dist_info.is_main:  # only once every check has passed: a refused run changes nothing
        with writing(run.path / "config.yaml", doing="write"):
            (run.path / "config.yaml").write_text(run_config_yaml)
    state = trainer.fit()
    if dist_info.is_main:
        log.info("%s", what_comes_next(cfg, state))
    if dist.is_initialized():
        dist.destroy_process_group()
    return trainer


def with_model(run_config_yaml: str, model_cfg: ModelConfig) -> str:
    """The run's config with the model settings its tokenizer decided (the vocabulary size
    and the special ids), as the checkpoints' model.json has them."""
    node = OmegaConf.create(run_config_yaml)
    for key in ("vocab_size", "pad_id", "bos_id", "eos_id"):
        node.model[key] = getattr(model_cfg, key)
    return OmegaConf.to_yaml(node)


def shown(path: str | Path) -> str:
    """A path as a command line names it: relative to the working directory under it."""
    path = Path(path)
    try:
        return str(path.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def what_comes_next(cfg: TrainConfig, state: TrainState) -> str:
    """The run's last words: where it is, the commands that translate, evaluate and average
    what it made, and, if it was ever validated, its best dev BLEU (the last line)."""
    run = shown(cfg.trainer.run_dir)
    lines = [f"finished at step {state.step} (epoch {state.epoch}, {state.skipped_steps} skipped "
             f"updates); the run is in {run}; next, translate, evaluate and average:"]
    first = "echo \"Ciao, come stai?\" | " if cfg.data.src_lang == "it" else ""
    lines.append(f"    {first}mt-translate checkpoint={run}" + ("" if first else " input.file=FILE"))
    lines.append(f"    mt-evaluate checkpoint={run} {_test_set(cfg.data)}")
    steps = len(step_checkpoints(cfg.trainer.run_dir))
    if steps >= 2:
        lines.append(f"    mt-average {run} --last {steps} -o {run}/checkpoints/avg_last{steps}")
    best = Path(cfg.trainer.run_dir) / "checkpoints" / "best"
    if state.best_bleu >= 0 and best.is_dir():
        step = load_meta(best).get("step", "?")
        lines.append(f"best dev BLEU {state.best_bleu:.2f}, at step {step}: {shown(best)}")
    else:
        lines.append("not validated, so no best checkpoint: checkpoint=RUN_DIR takes its newest")
    return "\n".join(lines)


def _test_set(data: DataConfig) -> str:
    """mt-evaluate's settings for the run's dev set."""
    if data.name == "files" and data.dev_src and data.dev_tgt:
        return f"test_set={shown(data.dev_src)},{shown(data.dev_tgt)}"
    if data.name == "files":
        given = {k: getattr(data, k) for k in ("train_src", "train_tgt", "dev_src") if getattr(data, k)}
        return " ".join(["data=files", *(f"data.{k}={shown(v)}" for k, v in given.items()), "test_set=dev"])
    corpus = next(iter(data.corpora)) if data.name == "mix" else data.name
    return f"data={corpus} test_set=dev"


def configure(hydra_cfg: DictConfig) -> tuple[TrainConfig, str]:
    """The checked TrainConfig and its YAML, run_dir set to Hydra's output directory.

    configs/train.yaml makes `hydra.run.dir` follow `trainer.run_dir`, and a sweep
    (`mt-train -m ...`) give each job the subdirectory `hydra.sweep.subdir` of
    `hydra.sweep.dir`, so that no two jobs share checkpoints; setting `hydra.run.dir` or
    `hydra.sweep.dir` directly is honoured too. The user's corpus paths are made
    absolute (against the working directory), so the saved config names the same files.
    A fine-tuning run (`trainer.init_from`) takes its model config from the checkpoint,
    with the dropout rates the command line sets; any other `model.*` setting or a model
    group on the command line is refused.
    """
    hydra = HydraConfig.get()
    if hydra.mode == RunMode.MULTIRUN:
        run_dir = str(Path(hydra.sweep.dir) / hydra.sweep.subdir)
    else:
        run_dir = hydra.run.dir
    OmegaConf.update(hydra_cfg, "trainer.run_dir", run_dir)
    keys = [f"data.{key}" for key in USER_PATH_KEYS] + ["trainer.init_from"]
    for key in keys:  # absolute in config.yaml: meaningful from any directory
        value = OmegaConf.select(hydra_cfg, key)
        if value:
            OmegaConf.update(hydra_cfg, key, str(user_path(value)))
    init_from = OmegaConf.select(hydra_cfg, "trainer.init_from")
    if init_from:  # the model is the checkpoint's, and only dropout may be overridden
        parent = finetune.parent_checkpoint(init_from, hydra_cfg.trainer.resume)
        explicit = {k: OmegaConf.select(hydra_cfg, f"model.{k}")
                    for k in finetune.command_line_model_keys(list(hydra.overrides.task))}
        model = finetune.model_from_parent(parent, explicit)
        OmegaConf.update(hydra_cfg, "model", model, merge=False)  # the typed node takes a ModelConfig
    cfg = to_dataclass(TrainConfig, hydra_cfg)
    fill_reset_settings(hydra_cfg, dataclasses.asdict(cfg))
    return cfg, OmegaConf.to_yaml(hydra_cfg, resolve=True)


def fill_reset_settings(node: DictConfig, values: dict[str, Any]) -> None:
    """Settings reset on the command line (`~optim.betas` composes as missing, '???':
    `overrides.rewrite`) take the values `to_dataclass` gave them, their defaults, so
    that config.yaml holds values."""
    for key in node:
        if OmegaConf.is_missing(node, key):
            node[key] = values[key]
        elif isinstance(node[key], DictConfig) and isinstance(values.get(key), dict):
            fill_reset_settings(node[key], values[key])


def job(hydra_cfg: DictConfig) -> float:
    """One `mt-train` run; returns its best mean dev BLEU, the objective a sweeper reads.

    In a sweep (`mt-train -m`) a run is a trial: one that diverges scores 0 and the sweep
    goes on (`sweep.trial_score`); alone, it ends the command with one line and status 1.
    """
    cfg, run_config_yaml = configure(hydra_cfg)
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        sweep.join_submitit_tasks()  # a trial of several submitit tasks trains with DDP
        return sweep.trial_score(lambda: train(cfg, run_config_yaml, _started))
    return train(cfg, run_config_yaml, _started).state.best_bleu


class RunDirPath(Callback):
    """Hydra callback (configs/train.yaml): Hydra makes the run (or sweep) directory before
    mt-train starts, and a path that is a file, or lies under one, would end in its
    traceback; this ends the command in one line instead, before anything is made."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _exit_unless_makeable(Path(config.hydra.run.dir))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _exit_unless_makeable(Path(config.hydra.sweep.dir))


def _exit_unless_makeable(path: Path) -> None:
    # Hydra turns a callback's exception into a warning: exit here (SystemExit passes).
    where = path
    while not where.exists() and where != where.parent:
        where = where.parent
    if path.exists() and not path.is_dir():
        sys.exit(f"mt-train: error: trainer.run_dir={path}: exists and is not a directory")
    if not where.is_dir():
        sys.exit(f"mt-train: error: trainer.run_dir={path}: cannot be made: {where} is a file")
    if not os.access(where, os.W_OK | os.X_OK):
        sys.exit(f"mt-train: error: trainer.run_dir={path}: cannot be written: no permission to write in {where}")
    try:  # what else stops Hydra's mkdir (a read-only or virtual file system, a full disk)
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        sys.exit(f"mt-train: error: trainer.run_dir={path}: cannot be made ({e.strerror or e})")


@hydra.main(config_path=cli.CONFIG_PATH, config_name="train", version_base="1.3")
def hydra_main(hydra_cfg: DictConfig) -> float:
    try:
        return cli.run("mt-train", lambda: job(hydra_cfg))
    except SystemExit as e:  # refused or interrupted: take back the empty directories Hydra made
        if e.code not in (0, None) and _started is not None:
            remove_new_empty_dirs(HydraConfig.get().runtime.output_dir, _started, Path.cwd())
        raise


def main() -> None:
    """The `mt-train` console script."""
    global _started
    _started = time.time() - 1.0  # file times come from a coarser clock, up to a tick behind
    cli.hydra_entry("mt-train", hydra_main, TrainConfig)


if __name__ == "__main__":
    main()
