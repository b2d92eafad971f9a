"""What a training run reports as it goes: `LogWindow` (the metrics of the updates since
the last log line) and `Logbook`, which shows them on the progress bar, as a log line when
there is no bar, and in TensorBoard (rank 0) beside the dev sets' scores, under the tags
that `transformer/inspection/learning_curves.py`, `scripts/gpu/gpu_check.py` and the tests read.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from transformer.device import anonymous_memory
from transformer.training.state import TrainState

if TYPE_CHECKING:  # the results it reports; validation is the trainer's to run
    from transformer.training.validation import DevResult

log = logging.getLogger(__name__)


class LogWindow:
    """Training metrics over the updates since the last log line, as fairseq logs them:
    losses are token-weighted means over the window (a single batch's loss jumps with
    its length bucket), tokens/s counts the window's wall time. Under DDP the metrics
    added are all ranks' (the trainer's `UpdateMeter` sums them at its read)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """An empty window, its clock started now."""
        self.loss = self.nll = 0.0
        self.tokens = 0
        self.start = time.perf_counter()

    def add(self, metrics: dict[str, float]) -> None:
        """Count one update's `loss_sum`, `nll_sum` and `tokens` (`Trainer.train_step`'s)."""
        self.loss += metrics["loss_sum"]
        self.nll += metrics["nll_sum"]
        self.tokens += int(metrics["tokens"])

    def summary(self) -> dict[str, float]:
        """Mean loss and NLL per target token, and target tokens/s: `loss`, `nll` and
        `tokens_per_s`."""
        n = max(self.tokens, 1)
        seconds = max(time.perf_counter() - self.start, 1e-9)
        return {"loss": self.loss / n, "nll": self.nll / n, "tokens_per_s": self.tokens / seconds}


class Logbook:
    """The progress bar, the log lines and TensorBoard of one training run.

    Args:
        tb_dir: where TensorBoard's event files go; None on ranks other than 0 (no events).
        device: the training device (its peak memory is logged: GPU, or the CPU heap).
    """

    def __init__(self, tb_dir: Path | None, device: torch.device) -> None:
        self.writer = SummaryWriter(str(tb_dir)) if tb_dir is not None else None
        self.device = device
        self.window = LogWindow()
        self.bar = tqdm(disable=True)
        self.end: tuple[int, str] = (0, "max_steps")  # where the run ends (`open`)

    def open(self, step: int, end: tuple[int, str], show_bar: bool) -> None:
        """Start the progress bar and a new log window, as training starts or resumes.

        Args:
            step: the updates applied already (a resumed run's).
            end: the update training is expected to end at and the limit that ends it
                there (`Budget.end`): the bar's total, and what it names.
            show_bar: draw the bar (else a log line per window stands in for it).
        """
        self.bar = tqdm(total=end[0], initial=step, dynamic_ncols=True, desc=f"train to {end[1]}",
                        disable=not show_bar)
        self.end = end
        self.window.reset()

    def add(self, metrics: dict[str, float]) -> None:
        """Count updates in the window where their loss is finite; applied ones move the bar.

        Args:
            metrics: host numbers, of one update or of several (the trainer's `UpdateMeter`
                reading, whose sums left non-finite losses out already): `loss_sum`,
                `nll_sum`, `tokens`, `applied` (how many were applied).
        """
        if math.isfinite(metrics["loss_sum"]):
            self.window.add(metrics)
        if metrics["applied"]:
            self.bar.update(int(metrics["applied"]))

    def train(self, state: TrainState, last: dict[str, float], lr: float,
              end: tuple[int, str] | None = None) -> None:
        """Report the window and start the next: its mean losses and speed on the bar, in
        the log (when there is no bar) and in TensorBoard, with the grad norm of the last
        update.

        Args:
            state: where training stands (step, epoch, skipped updates, training time).
            last: the last update's metrics.
            lr: the learning rate of the last update.
            end: the run's end as estimated now (`Budget.end`): the bar's new total and
                limit; None: as before.
        """
        window = self.window.summary()
        if end is not None and end != self.end:
            self.end, self.bar.total = end, end[0]
            self.bar.set_description_str(f"train to {end[1]}", refresh=False)
        self.bar.set_postfix(loss=f"{window['loss']:.3f}", tok_s=f"{window['tokens_per_s']:,.0f}",
                             epoch=state.epoch, lr=f"{lr:.1e}")
        if self.bar.disable:  # no progress bar (trainer.progress=false): a log line instead
            log.info("step %d: loss %.3f, %.0f target tokens/s, lr %.2e, epoch %d; %s ends the run "
                     "at about update %d", state.step, window["loss"], window["tokens_per_s"], lr,
                     state.epoch, self.end[1], self.end[0])
        if self.writer is not None:
            step, w = state.step, self.writer
            w.add_scalar("train/loss", window["loss"], step)
            w.add_scalar("train/nll", window["nll"], step)
            w.add_scalar("train/lr", lr, step)
            w.add_scalar("train/grad_norm", last["grad_norm"], step)
            w.add_scalar("train/tokens_per_s", window["tokens_per_s"], step)
            w.add_scalar("train/skipped_steps", state.skipped_steps, step)
            w.add_scalar("train/epoch", state.epoch, step)
            w.add_scalar("train/hours", state.train_seconds / 3600, step)  # what max_hours counts
            if self.device.type == "cuda":
                w.add_scalar("train/gpu_mem_gb", torch.cuda.max_memory_allocated(self.device) / 2**30, step)
            else:
                w.add_scalar("train/cpu_mem_gb", anonymous_memory() / 2**30, step)
        self.window.reset()

    def validation(self, step: int, results: dict[str, DevResult], score: float, best: float) -> None:
        """Report a validation: each dev set's scores in the log and in TensorBoard (with
        example translations), then the selection score and the best so far.

        Args:
            step: the updates applied.
            results: each dev set's scores, by name.
            score: their selection score (the dev BLEU, or the mean over the dev sets).
            best: the best selection score so far, this one included.
        """
        several = len(results) > 1
        if self.writer is not None:
            for name, r in results.items():
                prefix = f"dev/{name}" if several else "dev"
                for k in ("loss", "nll", "ppl", "bleu", "chrf"):
                    self.writer.add_scalar(f"{prefix}/{k}", getattr(r, k), step)
                if r.names.rate is not None:  # percent, on BLEU's scale
                    self.writer.add_scalar(f"{prefix}/name_copy", 100 * r.names.rate, step)
                examples = "\n\n".join(f"    src: {s}\n    ref: {ref}\n    hyp: {h}" for s, ref, h in r.examples)
                self.writer.add_text(f"{prefix}/translations", examples, step)
            if several:  # the selection score under the single-dev-set tag
                self.writer.add_scalar("dev/bleu", score, step)
        for name, r in results.items():
            label = f" {name}" if several else ""
            log.info("step %d dev%s: loss %.3f ppl %.2f BLEU %.2f chrF %.2f %s", step, label,
                     r.loss, r.ppl, r.bleu, r.chrf, r.names)
        what = "mean dev BLEU" if several else "dev BLEU"
        log.info("step %d %s %.2f (best %.2f)", step, what, score, best)

    def close(self) -> None:
        """Close the bar and flush TensorBoard's events."""
        self.bar.close()
        if self.writer is not None:
            self.writer.close()
