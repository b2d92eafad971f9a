"""Telling a diverged run from a skipped update: the trainer's guard against NaN and inf.

An update whose gradients hold inf or NaN is skipped (never applied). One such update is
noise (a bad batch; fp16's loss scaler finding its range); several in a row mean the
weights or the learning rate went wrong, and no later update will be finite again: the
run would skip updates forever. `DivergenceGuard` counts them and, past
`trainer.diverge_after`, ends the run with one line that says what happened and which
setting to change.

Why it is needed (docs/errors.md, "A run that diverges stops"): with `optim.lr=1e10` the
first update drives the weights to ~1e9 and every later loss is NaN; every update is then
skipped quickly (no single op stalls), and since only applied updates advance the step,
log, validate or look at the stop signal, a loop without this guard would never end.
"""

from __future__ import annotations

import math

import torch

from transformer.config import OptimConfig
from transformer.errors import UserError

# fp16 only: a skipped update lowers the loss scale, and overflow at the start of a run is
# how GradScaler finds its range. Below this scale (fairseq's --min-loss-scale), the
# gradients overflow without any scaling: those skips count as divergence.
FP16_MIN_SCALE = 1e-4
# A mean loss per token above this many times the larger of a uniform guess's (ln V) and
# the run's first update's (a fresh model's logits are not uniform: with a vocabulary of 8
# and d_model 1024 it starts above 3 ln V) is a run that has exploded while still finite
# (lr 50: losses of 1e4 to 1e11): no lower lr brings such weights back, so they must not
# become the checkpoint a resume continues from.
EXPLODED = 3.0


class TrainingDiverged(UserError, RuntimeError):
    """Training produced non-finite losses, gradients or weights; the message says what to try."""


def nonfinite_parameters(model: torch.nn.Module) -> list[str]:
    """Names of the parameters holding inf or NaN (one pass over the weights)."""
    return [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]


class DivergenceGuard:
    """Counts consecutive skipped updates (on the device, in the trainer's `UpdateMeter`);
    `check` raises TrainingDiverged once a streak has reached the limit, or the mean loss
    since the last read is over the limit of an exploded run.

    The count is kept where the updates run, so that no update waits for the host; the
    host looks at it when it reads the meter (at the next log line, validation, save or
    stop), and after a read that found a streak, at every update until an update is
    applied again. So a run that diverges stops after between `limit` and about
    `trainer.log_every` skipped updates, none of them applied.
    """

    def __init__(self, limit: int, optim: OptimConfig, precision: str, vocab_size: int | None = None) -> None:
        self.limit, self.optim, self.precision = limit, optim, precision
        self.max_loss = EXPLODED * math.log(vocab_size) if vocab_size and vocab_size > 1 else math.inf
        self.vocab_size = vocab_size
        self.first_loss: float | None = None  # the first update's per token, once read

    def counts(self, applied: torch.Tensor, loss_scale: torch.Tensor | None) -> torch.Tensor:
        """Whether an update counts toward divergence (a device bool): it was skipped and,
        in fp16, the loss scale after it (`loss_scale`, a device tensor) is below
        FP16_MIN_SCALE; above it, the scaler is still finding its range."""
        skipped = ~applied
        if self.precision == "fp16" and loss_scale is not None:
            return skipped & (loss_scale < FP16_MIN_SCALE)
        return skipped

    def check(self, step: int, reading: dict[str, float]) -> None:
        """After a read of the trainer's meter: `step` is the number of updates applied,
        `reading` the meter's (`worst_streak`, the last skipped update's `bad_loss` and
        `bad_grad_norm`; `loss_sum` and `tokens` of the finite losses since the last read;
        `first_loss_sum` and `first_tokens` of this process's first update, whose loss,
        computed with the weights the run starts from, raises the limit where it is above
        ln V). Under DDP the losses and tokens are all ranks' (`UpdateMeter.read`), so every
        rank raises at the same read, with the same message."""
        if self.first_loss is None and reading["first_tokens"]:
            self.first_loss = reading["first_loss_sum"] / reading["first_tokens"]
            if math.isfinite(self.first_loss):
                self.max_loss = max(self.max_loss, EXPLODED * self.first_loss)
        mean_loss = reading["loss_sum"] / reading["tokens"] if reading["tokens"] else 0.0
        if mean_loss > self.max_loss:
            raise TrainingDiverged(
                f"training diverged by update {step}: the loss is {mean_loss:.4g} per token, over "
                f"{EXPLODED:g} times a uniform guess's (ln {self.vocab_size} = "
                f"{math.log(self.vocab_size):.2f})"
                + (f" and the first update's ({self.first_loss:.2f})" if self.first_loss is not None else "")
                + f"; {self.advice()}")
        in_a_row = int(reading["worst_streak"])
        if in_a_row >= self.limit:
            loss, norm = reading["bad_loss"], reading["bad_grad_norm"]
            what = (f"the loss is {loss}" if not math.isfinite(loss)
                    else f"the gradient norm is {norm}")
            raise TrainingDiverged(
                f"training diverged after update {step}: {what} for {in_a_row} updates in a "
                f"row (trainer.diverge_after={self.limit}); {self.advice()}")

    def advice(self) -> str:
        """Which settings to change, with their values now."""
        o = self.optim
        tips = [f"lower optim.lr (now {o.lr:g})", f"raise optim.warmup_steps (now {o.warmup_steps})"]
        tips.append(f"lower optim.clip_norm (now {o.clip_norm:g})" if o.clip_norm > 0
                    else "set optim.clip_norm=1 (clipping is off)")
        if self.precision == "fp16":
            tips.append("train in bf16 or fp32 (trainer.precision)")
        return ", ".join(tips[:-1]) + f" or {tips[-1]}"

    def check_weights(self, model: torch.nn.Module, step: int) -> None:
        """Weights that turned inf or NaN (an applied update with an infinite learning
        rate) are neither validated nor saved: raise, the run stops as diverged (one read
        per parameter, before a validation or save only)."""
        bad = nonfinite_parameters(model)
        if bad:
            raise self.weights_diverged(step, bad)

    def weights_diverged(self, step: int, names: list[str]) -> TrainingDiverged:
        """The error for weights that turned inf or NaN after update `step`."""
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        return TrainingDiverged(
            f"training diverged at update {step}: the weights hold inf or NaN ({shown}), so they "
            f"are not validated or saved; {self.advice()}")
