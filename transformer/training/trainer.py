"""The training loop: updates, mixed precision, and when to log, validate, save and stop.

What is not the loop lives beside it: the training state and checkpoints in `state.py`,
the limits that end a run (and the progress bar's estimate of when) in `budget.py`,
SIGINT/SIGTERM in `signals.py`, the progress bar, log lines and TensorBoard in
`logbook.py`, dev-set scoring in `validation.py`, the divergence guard in `nan_guard.py`,
the optimizer update in `optimizer.py` (`Updater`), the device-side metrics in `update_meter.py`,
the batches collated ahead in `prefetch.py`.

The host never waits for the device inside an update (docs/performance.md, "The training
loop"): batches are collated ahead by a thread and copied asynchronously; an update's
metrics stay on the device (`UpdateMeter`) and the decision to skip a non-finite update
is taken there (`Updater`); the host counts each update as applied and recounts
(`read_and_recount`, one read) when it logs, validates, saves or stops:

    each update (`train_step`), device     the host, which reads nothing
      Updater: apply, or skip if not finite  state.step += 1 (as applied)
      UpdateMeter.add: sums, streak          |
                                             v
                                   `_due`? -- no --> the next update
                                             | yes: a log, validation or save step,
                                             |      the end, a signal, or a streak of skips
                                             v
      `read_and_recount`: UpdateMeter.read_and_recount, the one read (.tolist();
          under DDP, the ranks' losses and tokens all-reduced in it first)
          state.step -= skipped; state.skipped_steps += skipped
          the schedule set at state.step; the log window gets the reading;
          the divergence guard looks at the streak;
          read_every_update = streak > 0 (then `_due` every update until it ends)
                                             |
                                             v
                     log, validate, save or stop, at the recounted step

Shapes: B batch, S source length, T target length, V vocabulary.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from transformer.config import TrainConfig
from transformer.data.augment import Augmenter
from transformer.data.batching import Batch, TokenBatchSampler
from transformer.data.prepared_cache import PreparedData
from transformer.device import HeapTrimmer
from transformer.model.transformer import Transformer
from transformer.training.budget import Budget
from transformer.training.distributed import DistInfo, any_rank, token_normaliser
from transformer.training.forward import TrainForward
from transformer.training.logbook import Logbook
from transformer.training.nan_guard import DivergenceGuard, TrainingDiverged
from transformer.training.optimizer import Updater, build_optimizer, build_scheduler, schedule_at
from transformer.training.prefetch import Prefetcher, batch_stream
from transformer.training.signals import StopSignal
from transformer.training.state import Checkpoints, TrainState
from transformer.training.update_meter import UpdateMeter
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
        self.pad_to = cfg.data.pad_to_multiple or (8 if device.type == "cuda" else 1)
        self.train_ids = data.token_ids(model.cfg.vocab_size)  # numpy: batches built without the GIL
        self.sampler = TokenBatchSampler(
            *self.train_ids.lengths(), max_tokens=cfg.data.max_tokens, seed=self.tc.seed, shuffle=True,
            rank=dist_info.rank, world_size=dist_info.world_size, bucket_chunk=cfg.data.bucket_chunk,
            mixture=data.mixture(self.tc.seed), pad_to_multiple=self.pad_to, segmentations=data.segmentations,
        )
        self.checkpoints = Checkpoints(self.tc, run_config_yaml, model, data.tokenizer, self.optimizer, self.scheduler,
                                       self.scaler, owned, dist_info.is_main, optim=cfg.optim, sampler=self.sampler)
        self.budget = Budget(self.tc, self.sampler)  # what ends the run, and when
        self.update = Updater(model, self.optimizer, self.scaler, cfg.optim, device)
        self.meter = UpdateMeter(device, dist_info.world_size)  # under DDP its reads sum every rank's
        self.read_every_update = False  # read after every update (a streak of skipped ones is under way)
        self.last_reading: dict[str, float] = {"last_applied": 0.0, "grad_norm": 0.0}
        self.trim_heap = HeapTrimmer(self.tc.heap_slack_gb if device.type == "cpu" else None)
        self.validator = Validator(
            data.devs, data.tokenizer, cfg.decode, cfg.optim.label_smoothing, self.tc.precision,
            device, self.tc.val_max_tokens, self.tc.val_bleu_sentences, model.cfg.max_positions,
            after_batch=self.trim_heap)
        self.ddp = wrapped_in_ddp(model, device)  # DDP itself, whose `no_sync` `train_step` holds
        self.forward = TrainForward(model, self.ddp or model, self.tc.precision, device, self.tc.compile)
        run_dir = Path(self.tc.run_dir)
        self.logbook = Logbook(run_dir / "tb" if dist_info.is_main else None, device)
        self.signals = StopSignal(run_dir / "checkpoints")
        self.guard = DivergenceGuard(self.tc.diverge_after, cfg.optim, self.tc.precision, model.cfg.vocab_size)

    @property
    def stop_signal(self) -> int | None:
        """The SIGINT or SIGTERM that stopped `fit`, or None."""
        return self.signals.received

    def resume(self, candidates: list[Path]) -> Path | None:
        """Continue from the first readable of `candidates` (newest first); None: a new run."""
        path, self.state = self.checkpoints.resume(candidates, self.device) or (None, self.state)
        return path

    def save(self, name: str, with_state: bool = True, also: str | None = None) -> Path | None:
        """Checkpoint `name` of the current weights (never inf/NaN ones), and `also` (`best`)
        of the same ones, weights only (`Checkpoints.save`); None off rank 0."""
        self.read_and_recount()
        self.guard.check_weights(self.model, self.state.step)
        return self.checkpoints.save(name, self.state, with_state, also)

    # ---- the loop -------------------------------------------------------------------
    def fit(self) -> TrainState:
        """Train until max_steps (or max_epochs, max_hours, early stopping, SIGINT/SIGTERM)."""
        tc, s = self.tc, self.state
        first_step = s.step
        self.update.start(s.step, peak=self.scheduler.base_lrs[0])  # optim.lr, a resumed run's too
        self.budget.start(s)
        log.info("training until the first of %s", self.budget.describe())
        self.logbook.open(s.step, self.budget.end(s), show_bar=tc.progress and self.dist.is_main)
        self.signals.install()
        stream = Prefetcher(self._micro_batches(), self.cfg.data.prefetch_batches, pin=self.device.type == "cuda")
        early_stop = interrupted = False
        try:
            while s.step < tc.max_steps:
                t0 = time.perf_counter()
                micro = [next(stream) for _ in range(tc.accum_steps)]
                epoch, index, _ = micro[-1]
                if limit := self.budget.stop(s, epoch):
                    log.info("%s reached at step %d", limit, s.step)
                    break
                self.train_step([b for _, _, pieces in micro for b in pieces])
                s.at(epoch, index + 1)  # position of the next batch
                s.train_seconds += time.perf_counter() - t0
                self.trim_heap()
                if not self._due():
                    continue  # the steady state: nothing read back, the host runs ahead
                # a skipped update advances nothing, but the stop signal is still heeded
                if self.read_and_recount()["last_applied"]:
                    if s.step % tc.log_every == 0:
                        self.logbook.train(s, self.last_reading, self.update.lr_of(s.step),  # the update's own lr
                                           self.budget.end(s))
                    if s.step % tc.val_every == 0:
                        early_stop = self._validate_and_save()
                    elif tc.save_every and s.step % tc.save_every == 0:
                        self.save(f"step_{s.step}")
                early_stop, interrupted = any_rank((early_stop, self.stop_signal is not None), self.dist, self.device)
                if early_stop or interrupted:
                    break
            self.read_and_recount()
            self._finish(interrupted, first_step)
        except TrainingDiverged as e:
            newest = self.checkpoints.newest()
            kept = f"the last checkpoint, {newest}, is kept" if newest else "no checkpoint was written"
            raise TrainingDiverged(f"{e}; {kept}") from None
        finally:
            stream.close()
            self.signals.restore()
            self.logbook.close()
        return s

    def _due(self) -> bool:
        """Whether to read the updates' metrics now: a log, validation or save may fall on
        this step, the run may end, a signal (one process) or a streak of skips asks."""
        s, tc = self.state, self.tc
        grid = any(s.step % every == 0 for every in (tc.log_every, tc.val_every, tc.save_every) if every)
        alone = self.dist.world_size == 1 and self.stop_signal is not None
        return grid or alone or self.read_every_update or s.step >= tc.max_steps or not self.update.on_device

    def read_and_recount(self) -> dict[str, float]:
        """Read the updates' metrics since the last read (one read; `UpdateMeter.read_and_recount`
        takes skipped updates off `state.step`); the schedule's record and the log window
        follow, the divergence guard looks at the streak. Returns the reading."""
        if self.meter.pending == 0:
            return self.last_reading
        s, reading = self.state, self.meter.read_and_recount(self.state)
        schedule_at(self.scheduler, s.step)
        self.logbook.add(reading)
        self.last_reading, self.read_every_update = reading, reading["streak"] > 0
        self.guard.check(s.step, reading)
        return reading

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
        self.guard.check_weights(self.model, self.state.step)
        s, stop, better = self.state, False, False
        if self.dist.is_main:
            with saved_if_it_fails(self):
                results = self.validate()
            score = Validator.selection_score(results)
            better = score > s.best_bleu
            s.best_bleu, s.bad_validations = (score, 0) if better else (s.best_bleu, s.bad_validations + 1)
            self.logbook.validation(s.step, results, score, s.best_bleu)
            stop = self.tc.patience is not None and s.bad_validations >= self.tc.patience
        # `best`: links to step_N's files, in place before it (the weights written once)
        self.save(f"step_{s.step}", also="best" if better else None)
        return stop

    # ---- one update -----------------------------------------------------------------
    def _micro_batches(self):
        """Endless (epoch, index, Batch) stream of this rank's shard from the saved position."""
        return batch_stream(self.sampler, self.train_ids, self.tokenizer, self.state.epoch, self.state.batch_index,
                            self.pad_to, self.model.cfg.vocab_size, augmenter(self.cfg, self.data, self.pad_to))

    def train_step(self, batches: list[Batch]) -> dict:
        """One optimizer update over `batches` (gradient accumulation), read nowhere: counted
        as applied until `read_and_recount` reads whether it was. Returns its metrics: `loss_sum`,
        `nll_sum`, `grad_norm`, `applied` (device tensors), `tokens` (an int, this rank's)."""
        self.forward.net.train()  # what runs the forward: model, DDP, DDP compiled
        n_tokens = sum(b.n_tgt_tokens for b in batches)  # shapes: known on the host
        norm = token_normaliser(n_tokens, self.dist, self.device)
        loss_sum = nll_sum = 0
        for i, batch in enumerate(batches):
            batch = batch.to(self.device, non_blocking=True)
            last = i == len(batches) - 1  # only its backward all-reduces: DDP's forward reads
            # `no_sync`'s flag outside the compiled graph, so compiled DDP holds back the others too
            with contextlib.nullcontext() if last or self.ddp is None else self.ddp.no_sync():
                loss, nll = self.forward(batch, self.cfg.optim.label_smoothing, first=i == 0)
                self.scaler.scale(loss / norm).backward()
            self.forward.after_backward(first=i == 0)
            loss_sum, nll_sum = loss_sum + loss.detach(), nll_sum + nll
        grad_norm, applied = self.update()
        self.state.step += 1  # as applied; `read_and_recount` takes a skipped one back
        metrics = {"loss_sum": loss_sum, "nll_sum": nll_sum, "grad_norm": grad_norm,
                   "applied": applied, "tokens": n_tokens}
        scale = self.scaler._get_scale_async() if self.scaler.is_enabled() else None
        self.meter.add(metrics, self.guard.counts(applied, scale))
        return metrics

    def validate(self) -> dict[str, DevResult]:
        """Every dev set's scores (rank 0 only)."""
        return self.validator(self.model)


def augmenter(cfg: TrainConfig, data: PreparedData, pad_to: int) -> Augmenter | None:
    """What changes the training pairs on the fly (data.augment); None when nothing is on."""
    if not cfg.data.augment.active:
        return None
    on = ", ".join(f"{k} {v:g}" for k, v in dataclasses.asdict(cfg.data.augment).items() if v > 0)
    log.info("data.augment: training pairs changed on the fly (%s); dev and test sets as they are", on)
    return Augmenter(cfg.data.augment, cfg.trainer.seed, data.train, data.tokenizer, cfg.data.max_len,
                     cfg.data.max_tokens, pad_to, data.segmentations)


def wrapped_in_ddp(model: Transformer, device: torch.device) -> DistributedDataParallel | None:
    """`model` in DistributedDataParallel in a torchrun process group (one process or
    several); None outside one."""
    if not dist.is_initialized():
        return None
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


@contextlib.contextmanager
def saved_if_it_fails(trainer: Trainer):
    """A failure inside (validation) never loses the updates since the last save: the step
    checkpoint is written, then the error goes on."""
    try:
        yield
    except Exception:
        trainer.save(f"step_{trainer.state.step}")
        raise
