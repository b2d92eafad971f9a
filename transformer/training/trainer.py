"""The training loop: updates, mixed precision, and when to log, validate, save and stop.

What is not the loop lives beside it: the training state and checkpoints in `state.py`,
SIGINT/SIGTERM in `signals.py`, the progress bar, log lines and TensorBoard in
`logbook.py`, dev-set scoring in `validation.py`, the divergence guard in `nan_guard.py`.

Shapes: B batch, S source length, T target length, V vocabulary.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from transformer.config import TrainConfig
from transformer.data.batching import Batch, TokenBatchSampler, collate, token_lengths
from transformer.data.pipeline import PreparedData
from transformer.device import HeapTrimmer
from transformer.model.transformer import Transformer
from transformer.training.distributed import DistInfo
from transformer.training.logbook import Logbook
from transformer.training.loss import batch_loss
from transformer.training.nan_guard import DivergenceGuard, TrainingDiverged, nonfinite_parameters
from transformer.training.optimizer import build_optimizer, build_scheduler
from transformer.training.signals import StopSignal
from transformer.training.state import Checkpoints, TrainState
from transformer.training.validation import DevResult, Validator

log = logging.getLogger(__name__)


class Trainer:
    """Runs the training loop of one run: its model, optimizer, schedule, data stream,
    validation and checkpoints. `fit` trains; `resume` continues from a checkpoint.

    `owned` names the checkpoints of this run already in its directory (a resumed run's):
    the trainer replaces or prunes only those and the ones it writes.
    """

    def __init__(self, cfg: TrainConfig, run_config_yaml: str, data: PreparedData,
                 model: Transformer, device: torch.device, dist_info: DistInfo,
                 owned: set[str] | None = None) -> None:
        self.cfg, self.tc = cfg, cfg.trainer
        self.data, self.tokenizer = data, data.tokenizer
        self.model, self.device, self.dist = model, device, dist_info
        self.optimizer = build_optimizer(model, cfg.optim, device)
        self.scheduler = build_scheduler(self.optimizer, cfg.optim)
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.tc.precision == "fp16")
        self.state = TrainState()
        self.checkpoints = Checkpoints(self.tc, run_config_yaml, model, data.tokenizer, self.optimizer,
                                       self.scheduler, self.scaler, owned, dist_info.is_main)
        self.train_ids = data.train.select_columns(["src_ids", "tgt_ids"])
        self.sampler = TokenBatchSampler(
            *token_lengths(self.train_ids), max_tokens=cfg.data.max_tokens, seed=self.tc.seed, shuffle=True,
            rank=dist_info.rank, world_size=dist_info.world_size, bucket_chunk=cfg.data.bucket_chunk,
            mixture=data.mixture(self.tc.seed),
        )
        self.trim_heap = HeapTrimmer(self.tc.heap_slack_gb if device.type == "cpu" else None)
        self.validator = Validator(
            data.devs, data.tokenizer, cfg.decode, cfg.optim.label_smoothing, self.tc.precision,
            device, self.tc.val_max_tokens, self.tc.val_bleu_sentences, model.cfg.max_positions,
            after_batch=self.trim_heap)
        self.net: torch.nn.Module = model  # what forward runs through: DDP and/or compiled
        if dist.is_initialized():  # torchrun, one process or several
            self.net = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        if self.tc.compile:
            self.net = torch.compile(self.net)
        run_dir = Path(self.tc.run_dir)
        self.logbook = Logbook(run_dir / "tb" if dist_info.is_main else None, device, dist_info.world_size)
        self.signals = StopSignal(run_dir / "checkpoints")
        self.guard = DivergenceGuard(self.tc.diverge_after, cfg.optim, self.tc.precision)

    @property
    def stop_signal(self) -> int | None:
        """The SIGINT or SIGTERM that stopped `fit`, or None."""
        return self.signals.received

    def resume(self, candidates: list[Path]) -> Path | None:
        """Continue from the first readable of `candidates` (newest first); None: a new run."""
        path, self.state = self.checkpoints.resume(candidates, self.device) or (None, self.state)
        return path

    def save(self, name: str, with_state: bool = True) -> Path | None:
        """Checkpoint `name` of the current weights (never inf/NaN ones); None off rank 0."""
        self._check_weights()
        return self.checkpoints.save(name, self.state, with_state)

    # ---- the loop -------------------------------------------------------------------
    def fit(self) -> TrainState:
        """Train until max_steps (or max_epochs, max_hours, early stopping, SIGINT/SIGTERM)."""
        tc, s = self.tc, self.state
        stream = self._micro_batches()
        first_step = s.step
        self.logbook.open(s.step, tc.max_steps, show_bar=tc.progress and self.dist.is_main)
        self.signals.install()
        early_stop = interrupted = False
        try:
            while s.step < tc.max_steps:
                t0 = time.perf_counter()
                micro = [next(stream) for _ in range(tc.accum_steps)]
                epoch, index, _ = micro[-1]
                if tc.max_epochs is not None and epoch >= tc.max_epochs:
                    break
                if tc.max_hours is not None and s.train_seconds >= tc.max_hours * 3600:
                    log.info("max_hours=%s reached at step %d", tc.max_hours, s.step)
                    break
                metrics = self.train_step([b for _, _, b in micro])
                s.epoch, s.batch_index = epoch, index + 1  # position of the next batch
                s.train_seconds += time.perf_counter() - t0
                self.guard.check(s.step, metrics, self.scaler.get_scale() if self.scaler.is_enabled() else None)
                self.logbook.add(metrics)
                # A skipped update advances nothing here, but is counted, and the stop
                # signal is still heeded: a run that only skips would never end otherwise.
                if metrics["applied"]:
                    if s.step % tc.log_every == 0:
                        self.logbook.train(s, metrics, self.scheduler.get_last_lr()[0])
                    if s.step % tc.val_every == 0:
                        early_stop = self._validate_and_save()
                    elif tc.save_every and s.step % tc.save_every == 0:
                        self.save(f"step_{s.step}")
                self.trim_heap()
                early_stop, interrupted = self._agree(early_stop, self.stop_signal is not None)
                if early_stop or interrupted:
                    break
            self._finish(interrupted, first_step)
        except TrainingDiverged as e:
            newest = self.checkpoints.newest()
            kept = f"the last checkpoint, {newest}, is kept" if newest else "no checkpoint was written"
            raise TrainingDiverged(f"{e}; {kept}") from None
        finally:
            self.signals.restore()
            self.logbook.close()
        return s

    def _finish(self, interrupted: bool, first_step: int) -> None:
        """The checkpoint a run ends with: saved if interrupted, else validated and saved."""
        s = self.state
        newest = self.checkpoints.newest()
        last_saved = newest is not None and newest.name == f"step_{s.step}"
        if interrupted:
            log.warning("interrupted: saving a checkpoint at step %d and exiting", s.step)
            if not last_saved:
                self.save(f"step_{s.step}")
        elif not last_saved or (s.step > first_step and s.step % self.tc.val_every != 0):
            # the last update is validated too, so that `best` can be the final weights
            # (max_steps=3250 with val_every=500 and save_every=250 saved step_3250 unscored)
            self._validate_and_save()

    def _validate_and_save(self) -> bool:
        """Validate (rank 0), keep `best` by the selection score, save `step_N`; True when
        early stopping's patience ran out."""
        self._check_weights()
        s, stop = self.state, False
        if self.dist.is_main:
            results = self.validate()
            score = Validator.selection_score(results)
            if score > s.best_bleu:
                s.best_bleu, s.bad_validations = score, 0
                self.save("best", with_state=False)
            else:
                s.bad_validations += 1
            self.logbook.validation(s.step, results, score, s.best_bleu)
            stop = self.tc.patience is not None and s.bad_validations >= self.tc.patience
        self.save(f"step_{s.step}")
        return stop

    def _agree(self, early_stop: bool, interrupted: bool) -> tuple[bool, bool]:
        """All ranks stop together: if any rank was signalled, or rank 0 stops early."""
        if self.dist.world_size == 1:
            return early_stop, interrupted
        flags = torch.tensor([float(early_stop), float(interrupted)], device=self.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return bool(flags[0]), bool(flags[1])

    def _check_weights(self) -> None:
        """Weights that turned inf or NaN (an applied update with an infinite learning
        rate) are neither validated nor saved: the run stops as diverged."""
        bad = nonfinite_parameters(self.model)
        if bad:
            raise self.guard.weights_diverged(self.state.step, bad)

    # ---- one update -----------------------------------------------------------------
    def _micro_batches(self):
        """Endless (epoch, index, Batch) stream of this rank's shard from the saved position."""
        while True:
            epoch = self.state.epoch
            batches = self.sampler.batches(epoch)
            for index in range(self.state.batch_index, len(batches)):
                batch = collate(self.train_ids[batches[index]], self.tokenizer.pad_id, self.tokenizer.bos_id,
                                self.tokenizer.eos_id)
                yield epoch, index, batch
            self.state.epoch, self.state.batch_index = epoch + 1, 0

    def train_step(self, batches: list[Batch]) -> dict[str, float]:
        """One optimizer update over `batches` (gradient accumulation). Returns metrics:
        summed loss and NLL, their means per target token, grad norm, tokens, applied."""
        self.net.train()
        n_tokens = sum(b.n_tgt_tokens for b in batches)
        loss_sum = nll_sum = 0.0
        for i, batch in enumerate(batches):
            batch = batch.to(self.device)
            sync = i == len(batches) - 1 or not isinstance(self.net, DistributedDataParallel)
            ctx = contextlib.nullcontext() if sync else self.net.no_sync()
            with ctx:
                loss, nll = batch_loss(self.net, batch, self.cfg.optim.label_smoothing,
                                       self.tc.precision, self.device)
                self.scaler.scale(loss / n_tokens).backward()
            loss_sum += loss.item()
            nll_sum += nll.item()
        self.scaler.unscale_(self.optimizer)
        max_norm = self.cfg.optim.clip_norm if self.cfg.optim.clip_norm > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        applied = math.isfinite(grad_norm)
        if applied:
            self.scaler.step(self.optimizer)
            self.scheduler.step()
            self.state.step += 1
        else:  # an inf/NaN gradient: never applied, only counted
            self.state.skipped_steps += 1
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return {"loss": loss_sum / max(n_tokens, 1), "nll": nll_sum / max(n_tokens, 1),
                "loss_sum": loss_sum, "nll_sum": nll_sum,
                "grad_norm": grad_norm, "tokens": n_tokens, "applied": float(applied)}

    def validate(self) -> dict[str, DevResult]:
        """Every dev set's scores (rank 0 only)."""
        return self.validator(self.model)
