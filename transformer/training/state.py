"""The training state a checkpoint carries in and out: `TrainState` (where training stands),
the trainer state saved beside the weights (`trainer_state.pt`: optimizer, schedule, grad
scaler, RNG states and `TrainState`, the keys a resumed run reads), and `Checkpoints`, which
writes a run's checkpoints, keeps the last N and resumes exactly from one.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from transformer import checkpoint as ckpt
from transformer.config import OptimConfig, TrainerConfig
from transformer.data import epoch_resume
from transformer.data.batching import TokenBatchSampler
from transformer.data.tokenizer import Tokenizer
from transformer.model.transformer import Transformer
from transformer.training.distributed import rng_state, set_rng_state
from transformer.training.optimizer import inverse_sqrt_lr, schedule_at
from transformer.training.run_dir import RunDirError

log = logging.getLogger(__name__)


@dataclass
class TrainState:
    """Where training stands; saved in every checkpoint."""

    step: int = 0  # optimizer updates applied
    epoch: int = 0
    batch_index: int = 0  # next batch of this rank's shard in `epoch`
    skipped_steps: int = 0  # updates dropped for non-finite gradients
    best_bleu: float = -1.0  # best selection score (Validator.selection_score)
    bad_validations: int = 0  # validations since the best dev BLEU (early stopping)
    train_seconds: float = 0.0
    # the batchings `epoch` ran under before the present one, each with the global
    # batches it took (`data.epoch_resume`: a resume with other batching settings)
    epoch_parts: list[dict] = field(default_factory=list)

    def at(self, epoch: int, batch_index: int) -> None:
        """Training's position: batch `batch_index` of `epoch` is the next (a new epoch
        starts with no earlier batchings)."""
        if epoch != self.epoch:
            self.epoch_parts = []
        self.epoch, self.batch_index = epoch, batch_index


class Checkpoints:
    """A run's checkpoints, written and read: the weights with what describes them (tokenizer,
    run config, meta) and, unless told otherwise, the trainer state for exact resume.

    `owned` names the checkpoints of this run already in its directory (a resumed run's):
    only those and the ones written here are replaced or pruned. Only rank 0 writes.
    `optim` is the schedule in effect now (a resume applies it from the resumed step) and
    `sampler` the training batches (a resume with other batching settings continues the
    epoch with the pairs it has not seen: `data.epoch_resume`).
    """

    def __init__(self, tc: TrainerConfig, run_config_yaml: str, model: Transformer, tokenizer: Tokenizer,
                 optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler,
                 scaler: torch.amp.GradScaler, owned: set[str] | None = None, is_main: bool = True,
                 optim: OptimConfig | None = None, sampler: TokenBatchSampler | None = None) -> None:
        self.run_dir, self.keep_last, self.init_from = Path(tc.run_dir), tc.keep_last, tc.init_from
        self.run_config_yaml, self.model, self.tokenizer = run_config_yaml, model, tokenizer
        self.optimizer, self.scheduler, self.scaler = optimizer, scheduler, scaler
        self.owned = set(owned or ())
        self.is_main = is_main
        self.optim, self.sampler = optim or OptimConfig(), sampler

    def trainer_state(self, state: TrainState) -> dict[str, Any]:
        """What `trainer_state.pt` holds: tensors and plain containers only, so that it
        loads with `torch.load(weights_only=True)`.

        Args:
            state: where training stands.

        Returns:
            The optimizer, scheduler and grad scaler state dicts, this process's RNG states
            and `state` as a dict, under the keys `load` reads.
        """
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": rng_state(),
            "train_state": asdict(state),
            # what a resume compares with its own settings (`load`)
            "schedule": {"lr": self.optim.lr, "warmup_steps": self.optim.warmup_steps},
            "batching": self.sampler.settings if self.sampler is not None else {},
        }

    def save(self, name: str, state: TrainState, with_state: bool = True, also: str | None = None) -> Path | None:
        """Write checkpoint `name` (atomically); a `step_N` one then prunes the older ones
        this run owns down to `trainer.keep_last`.

        Args:
            name: the checkpoint's folder name in `checkpoints/` (`step_N`, `best`).
            state: where training stands (in the meta, and in the trainer state).
            with_state: also write the trainer state (`best` is weights only).
            also: a second name (`best`) for the same weights and meta without the trainer
                state: hard links to `name`'s files, put in place just before it
                (`checkpoint.save_checkpoint`), so the weights are written once.

        Returns:
            The checkpoint's path; None on ranks other than 0, which write nothing.
        """
        if not self.is_main:
            return None
        meta = {"step": state.step, "epoch": state.epoch,
                "best_bleu": state.best_bleu, "train_seconds": state.train_seconds}
        if self.init_from:  # a fine-tuning run names the checkpoint it started from
            meta["init_from"] = str(Path(self.init_from).absolute())
        folder = self.run_dir / "checkpoints"
        path = ckpt.save_checkpoint(
            folder / name, self.model, self.tokenizer, self.run_config_yaml, meta,
            self.trainer_state(state) if with_state else None, also=folder / also if also else None)
        self.owned.update(n for n in (name, also) if n)
        if name.startswith("step_"):
            ckpt.prune_checkpoints(self.run_dir, self.keep_last, self.owned)
        return path

    def newest(self) -> Path | None:
        """The run's newest `step_N` checkpoint, or None when there is none."""
        saved = ckpt.step_checkpoints(self.run_dir)
        return saved[-1] if saved else None

    def load(self, path: Path, device: torch.device) -> TrainState:
        """Continue from a checkpoint: weights, optimizer, schedule, grad scaler, RNGs.

        Everything is read before anything is changed, so a checkpoint that fails to load
        leaves the model and optimizer as they were.

        Args:
            path: a checkpoint with a trainer state.
            device: where the weights go.

        Returns:
            The training state saved in it (step, epoch, data position, best score...).

        Raises:
            CheckpointError: a file of the checkpoint is missing or unreadable.
            RunDirError: its tokenizer is not this run's.
        """
        weights, tokenizer = ckpt.load_model(path, device)
        saved = ckpt.load_trainer_state(path)
        if tokenizer.proto != self.tokenizer.proto:
            raise RunDirError(
                f"cannot resume from {path}: its tokenizer differs from the one prepared for "
                f"this run's data (the corpus or data.* settings changed); start a new "
                f"trainer.run_dir or set trainer.resume=never")
        self.model.load_state_dict(weights.state_dict())
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        self.scaler.load_state_dict(saved["scaler"])
        set_rng_state(saved["rng"])
        state = TrainState(**saved["train_state"])
        log.info("resumed from %s at step %d (epoch %d, batch %d)", path, state.step,
                 state.epoch, state.batch_index)
        self._apply_schedule(saved, state.step)
        if self.sampler is not None:
            self._continue_epoch(saved.get("batching") or {}, state)
        return state

    def _continue_epoch(self, saved: dict[str, int], state: TrainState) -> None:
        """The data position under this run's batching (`data.epoch_resume`): another one,
        mid-epoch, goes on with the epoch's pairs not seen yet. A change is logged."""
        now = self.sampler.settings
        changed = epoch_resume.changes(saved, now)
        state.batch_index, state.epoch_parts = epoch_resume.resumed_position(
            state.batch_index, state.epoch_parts, saved, now)
        left = epoch_resume.continue_epoch(self.sampler, state.epoch, state.epoch_parts)
        if not changed:
            return
        if epoch_resume.data_changed(saved, now):
            log.warning("resumed with other training data (%s): epoch %d starts again from its first batch",
                        ", ".join(changed), state.epoch)
            return
        if not state.epoch_parts:
            log.info("resumed with other batching (%s) from the start of epoch %d", ", ".join(changed), state.epoch)
            return
        seed = state.epoch_parts[0]["seed"]
        later = "" if seed == now["seed"] else (f"; trainer.seed {now['seed']} takes effect at epoch "
                                                 f"{state.epoch + 1}, epoch {state.epoch} keeps the order seed {seed} drew")
        log.info("resumed mid-epoch %d with other batching (%s): the epoch goes on with the %d pairs it has "
                 "not seen yet%s", state.epoch, ", ".join(changed), left, later)

    def _apply_schedule(self, saved: dict[str, Any], step: int) -> None:
        """The schedule in effect now (`optim.lr`, `optim.warmup_steps`) from update `step`
        on, whatever the checkpoint's: LambdaLR's restored `base_lrs` and the optimizer's
        `initial_lr` are the checkpoint's peak. A change is logged, old and new."""
        old = saved.get("schedule") or {"lr": saved["scheduler"]["base_lrs"][0], "warmup_steps": None}
        new = {"lr": self.optim.lr, "warmup_steps": self.optim.warmup_steps}
        lr_before = self.scheduler.get_last_lr()[0]
        self.scheduler.base_lrs = [self.optim.lr] * len(self.scheduler.base_lrs)
        for group in self.optimizer.param_groups:
            group["initial_lr"] = self.optim.lr
        schedule_at(self.scheduler, step)
        changed = [f"optim.{k} {old[k]:g} -> {new[k]:g}" for k in new if old[k] is not None and old[k] != new[k]]
        if changed:
            log.info("resumed with a new schedule: %s (the run's config.yaml and its next checkpoints "
                     "record it); the lr at update %d is %.3g (was %.3g)", ", ".join(changed), step + 1,
                     inverse_sqrt_lr(step + 1, self.optim.lr, self.optim.warmup_steps), lr_before)

    def resume(self, candidates: list[Path], device: torch.device) -> tuple[Path, TrainState] | None:
        """Continue from the first readable of `candidates` (newest first).

        An unreadable checkpoint is skipped with a warning naming it, unless it is the last
        candidate (or the only one, a `trainer.resume` path): then its error stands.

        Args:
            candidates: checkpoints to try, newest first (none: a new run).
            device: where the weights go.

        Returns:
            The checkpoint resumed from and its training state; None for a new run.
        """
        for i, path in enumerate(candidates):
            try:
                return path, self.load(path, device)
            except ckpt.CheckpointError as e:
                if i + 1 == len(candidates):
                    raise
                log.warning("cannot resume from %s (%s): falling back to %s", path, e, candidates[i + 1].name)
        return None
