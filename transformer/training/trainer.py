"""The training loop: updates, mixed precision, validation, checkpoints and exact resume.

Shapes: B batch, S source length, T target length, V vocabulary.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from transformer import checkpoint as ckpt
from transformer.config import TrainConfig
from transformer.data.batching import Batch, TokenBatchSampler, collate, token_lengths
from transformer.data.pipeline import PreparedData
from transformer.device import HeapTrimmer, anonymous_memory
from transformer.model.transformer import Transformer
from transformer.training.distributed import DistInfo, rng_state, set_rng_state
from transformer.training.loss import batch_loss
from transformer.training.nan_guard import DivergenceGuard, TrainingDiverged, nonfinite_parameters
from transformer.training.optimizer import build_optimizer, build_scheduler
from transformer.training.run_dir import RunDirError
from transformer.training.validation import DevResult, Validator

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


class LogWindow:
    """Training metrics over the updates since the last log line, as fairseq logs them:
    losses are token-weighted means over the window (a single batch's loss jumps with
    its length bucket), tokens/s counts the window's wall time."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.loss = self.nll = 0.0
        self.tokens = 0
        self.start = time.perf_counter()

    def add(self, metrics: dict[str, float]) -> None:
        self.loss += metrics["loss_sum"]
        self.nll += metrics["nll_sum"]
        self.tokens += int(metrics["tokens"])

    def summary(self, world_size: int = 1) -> dict[str, float]:
        """Mean loss and NLL per target token, and target tokens/s over all ranks."""
        n = max(self.tokens, 1)
        seconds = max(time.perf_counter() - self.start, 1e-9)
        return {"loss": self.loss / n, "nll": self.nll / n,
                "tokens_per_s": self.tokens * world_size / seconds}


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
        self.run_config_yaml = run_config_yaml
        self.data, self.tokenizer = data, data.tokenizer
        self.model, self.device, self.dist = model, device, dist_info
        self.run_dir = Path(self.tc.run_dir)
        self.owned = set(owned or ())
        self.optimizer = build_optimizer(model, cfg.optim, device)
        self.scheduler = build_scheduler(self.optimizer, cfg.optim)
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.tc.precision == "fp16")
        self.state = TrainState()
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
        self.writer = SummaryWriter(str(self.run_dir / "tb")) if dist_info.is_main else None
        self.stop_signal: int | None = None
        self.guard = DivergenceGuard(self.tc.diverge_after, cfg.optim, self.tc.precision)

    # ---- state ----------------------------------------------------------------------
    def trainer_state(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": rng_state(),
            "train_state": asdict(self.state),
        }

    def resume(self, candidates: list[Path]) -> Path | None:
        """Continue from the first readable of `candidates` (newest first); None: a new run.

        An unreadable checkpoint is skipped with a warning naming it, unless it is the last
        candidate (or the only one, a `trainer.resume` path): then its error stands.
        """
        for i, path in enumerate(candidates):
            try:
                self.load_state(path)
                return path
            except ckpt.CheckpointError as e:
                if i + 1 == len(candidates):
                    raise
                log.warning("cannot resume from %s (%s): falling back to %s", path, e, candidates[i + 1].name)
        return None

    def load_state(self, path: Path) -> None:
        """Continue from a checkpoint: weights, optimizer, schedule, RNGs, data position.

        Everything is read before anything is changed, so a checkpoint that fails to load
        leaves the trainer as it was.
        """
        weights, tokenizer = ckpt.load_model(path, self.device)
        state = ckpt.load_trainer_state(path)
        if tokenizer.proto != self.tokenizer.proto:
            raise RunDirError(
                f"cannot resume from {path}: its tokenizer differs from the one prepared for "
                f"this run's data (the corpus or data.* settings changed); start a new "
                f"trainer.run_dir or set trainer.resume=never")
        self.model.load_state_dict(weights.state_dict())
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        set_rng_state(state["rng"])
        self.state = TrainState(**state["train_state"])
        log.info("resumed from %s at step %d (epoch %d, batch %d)", path, self.state.step,
                 self.state.epoch, self.state.batch_index)

    def save(self, name: str, with_state: bool = True) -> Path | None:
        self._check_weights()
        if not self.dist.is_main:
            return None
        meta = {"step": self.state.step, "epoch": self.state.epoch,
                "best_bleu": self.state.best_bleu, "train_seconds": self.state.train_seconds}
        if self.tc.init_from:  # a fine-tuning run names the checkpoint it started from
            meta["init_from"] = str(Path(self.tc.init_from).absolute())
        path = ckpt.save_checkpoint(
            self.run_dir / "checkpoints" / name, self.model, self.tokenizer,
            self.run_config_yaml, meta, self.trainer_state() if with_state else None)
        self.owned.add(name)
        if name.startswith("step_"):
            ckpt.prune_checkpoints(self.run_dir, self.tc.keep_last, self.owned)
        return path

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

    # ---- validation -----------------------------------------------------------------
    def validate(self) -> dict[str, DevResult]:
        """Every dev set's scores (rank 0 only), logged to TensorBoard."""
        results = self.validator(self.model)
        if self.writer is not None:
            several = len(results) > 1
            for name, r in results.items():
                prefix = f"dev/{name}" if several else "dev"
                for k in ("loss", "nll", "ppl", "bleu", "chrf"):
                    self.writer.add_scalar(f"{prefix}/{k}", getattr(r, k), self.state.step)
                if r.names.rate is not None:  # percent, on BLEU's scale
                    self.writer.add_scalar(f"{prefix}/name_copy", 100 * r.names.rate, self.state.step)
                examples = "\n\n".join(f"    src: {s}\n    ref: {r}\n    hyp: {h}" for s, r, h in r.examples)
                self.writer.add_text(f"{prefix}/translations", examples, self.state.step)
            if several:  # the selection score under the single-dev-set tag
                self.writer.add_scalar("dev/bleu", Validator.selection_score(results), self.state.step)
        return results

    def _after_validation(self, results: dict[str, DevResult]) -> bool:
        """Keep the best checkpoint by the selection score; True when patience runs out."""
        s = self.state
        score = Validator.selection_score(results)
        if score > s.best_bleu:
            s.best_bleu, s.bad_validations = score, 0
            self.save("best", with_state=False)
        else:
            s.bad_validations += 1
        for name, r in results.items():
            label = f" {name}" if len(results) > 1 else ""
            log.info("step %d dev%s: loss %.3f ppl %.2f BLEU %.2f chrF %.2f %s", s.step, label,
                     r.loss, r.ppl, r.bleu, r.chrf, r.names)
        what = "mean dev BLEU" if len(results) > 1 else "dev BLEU"
        log.info("step %d %s %.2f (best %.2f)", s.step, what, score, s.best_bleu)
        return self.tc.patience is not None and s.bad_validations >= self.tc.patience

    # ---- the loop -------------------------------------------------------------------
    def fit(self) -> TrainState:
        """Train until max_steps (or max_epochs, max_hours, early stopping, SIGINT/SIGTERM)."""
        tc, s = self.tc, self.state
        stream = self._micro_batches()
        bar = tqdm(total=tc.max_steps, initial=s.step, dynamic_ncols=True, desc="train",
                   disable=not (tc.progress and self.dist.is_main))
        self._install_signal_handlers()
        window = LogWindow()
        early_stop = interrupted = False
        first_step = s.step
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
                if math.isfinite(metrics["loss_sum"]):
                    window.add(metrics)
                # A skipped update advances nothing below, but is counted, and the stop
                # signal is still heeded: a run that only skips would never end otherwise.
                self.guard.check(s.step, metrics, self.scaler.get_scale() if self.scaler.is_enabled() else None)
                if metrics["applied"]:
                    early_stop = self._after_update(window, metrics, bar, epoch)
                self.trim_heap()
                early_stop, interrupted = self._agree(early_stop, self.stop_signal is not None)
                if early_stop or interrupted:
                    break
            self._finish(interrupted, first_step)
        except TrainingDiverged as e:
            saved = ckpt.step_checkpoints(self.run_dir)
            kept = f"the last checkpoint, {saved[-1]}, is kept" if saved else "no checkpoint was written"
            raise TrainingDiverged(f"{e}; {kept}") from None
        finally:
            bar.close()
            if self.writer is not None:
                self.writer.close()
        return s

    def _finish(self, interrupted: bool, first_step: int) -> None:
        """The checkpoint a run ends with: saved if interrupted, else validated and saved."""
        s = self.state
        if interrupted:
            log.warning("interrupted: saving a checkpoint at step %d and exiting", s.step)
        saved = ckpt.step_checkpoints(self.run_dir)
        last_saved = bool(saved) and saved[-1].name == f"step_{s.step}"
        if interrupted:
            if not last_saved:
                self.save(f"step_{s.step}")
        elif not last_saved or (s.step > first_step and s.step % self.tc.val_every != 0):
            # the last update is validated too, so that `best` can be the final weights
            # (max_steps=3250 with val_every=500 and save_every=250 saved step_3250 unscored)
            self._validate_and_save()

    def _after_update(self, window: LogWindow, metrics: dict[str, float], bar: tqdm, epoch: int) -> bool:
        """Log, validate and save as the schedule says after an applied update; True:
        stop early (patience ran out)."""
        s, tc = self.state, self.tc
        bar.update(1)
        if s.step % tc.log_every == 0:
            self._log_train(window.summary(self.dist.world_size), metrics, bar, epoch)
            window.reset()
        if s.step % tc.val_every == 0:
            return self._validate_and_save()
        if tc.save_every and s.step % tc.save_every == 0:
            self.save(f"step_{s.step}")
        return False

    def _check_weights(self) -> None:
        """Weights that turned inf or NaN (an applied update with an infinite learning
        rate) are neither validated nor saved: the run stops as diverged."""
        bad = nonfinite_parameters(self.model)
        if bad:
            raise self.guard.weights_diverged(self.state.step, bad)

    def _validate_and_save(self) -> bool:
        self._check_weights()
        stop = False
        if self.dist.is_main:
            stop = self._after_validation(self.validate())
        self.save(f"step_{self.state.step}")
        return stop

    def _agree(self, early_stop: bool, interrupted: bool) -> tuple[bool, bool]:
        """All ranks stop together: if any rank was signalled, or rank 0 stops early."""
        if self.dist.world_size == 1:
            return early_stop, interrupted
        flags = torch.tensor([float(early_stop), float(interrupted)], device=self.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return bool(flags[0]), bool(flags[1])

    def _log_train(self, window: dict[str, float], last: dict[str, float], bar: tqdm, epoch: int) -> None:
        """The window's mean losses and speed on the bar, in the log (without a bar) and in
        TensorBoard; grad norm of the last update."""
        lr = self.scheduler.get_last_lr()[0]
        bar.set_postfix(loss=f"{window['loss']:.3f}", tok_s=f"{window['tokens_per_s']:,.0f}",
                        epoch=epoch, lr=f"{lr:.1e}")
        if bar.disable:  # no progress bar (trainer.progress=false): a log line instead
            log.info("step %d: loss %.3f, %.0f target tokens/s, lr %.2e, epoch %d",
                     self.state.step, window["loss"], window["tokens_per_s"], lr, epoch)
        if self.writer is None:
            return
        step, w = self.state.step, self.writer
        w.add_scalar("train/loss", window["loss"], step)
        w.add_scalar("train/nll", window["nll"], step)
        w.add_scalar("train/lr", lr, step)
        w.add_scalar("train/grad_norm", last["grad_norm"], step)
        w.add_scalar("train/tokens_per_s", window["tokens_per_s"], step)
        w.add_scalar("train/skipped_steps", self.state.skipped_steps, step)
        w.add_scalar("train/epoch", self.state.epoch, step)
        w.add_scalar("train/hours", self.state.train_seconds / 3600, step)  # what max_hours counts
        if self.device.type == "cuda":
            w.add_scalar("train/gpu_mem_gb", torch.cuda.max_memory_allocated(self.device) / 2**30, step)
        else:
            w.add_scalar("train/cpu_mem_gb", anonymous_memory() / 2**30, step)

    def _install_signal_handlers(self) -> None:
        """SIGINT/SIGTERM finish the current update, save a checkpoint and exit cleanly; a
        second one while the first waits ends the process at once, saving nothing (a
        checkpoint being written then stays a leftover the next start clears away)."""
        def handler(signum, frame):
            name = signal.Signals(signum).name
            if self.stop_signal is not None:
                print(f"mt-train: second {name}: stopping now without saving; the checkpoints "
                      f"in {self.run_dir / 'checkpoints'} are as they were", file=sys.stderr, flush=True)
                os._exit(128 + signum)
            self.stop_signal = signum
            print(f"mt-train: {name}: finishing this update, then saving a checkpoint; send it "
                  "again to stop at once without saving", file=sys.stderr, flush=True)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, handler)
