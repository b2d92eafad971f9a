"""What the updates did, kept on the device and read once per log line: `UpdateMeter`.

Inside an update nothing is read back to the host (on a GPU each read stops the host until
the device has caught up, and the host can no longer queue the next update ahead). So each
update's loss and NLL sums, token count, gradient norm and whether it was applied are
added up here in device tensors, and what the divergence guard looks at is kept here too:
the count of skipped updates in a row and the loss of this process's first update. The
trainer reads them all at once (`read`, one transfer of twelve numbers) when it logs,
validates, saves or stops.

Under DDP the losses and token counts are each rank's own, so `read` first sums them over
the ranks (one all-reduce of six numbers, on the device, at the read every rank makes at
the same update): every rank then logs, and decides whether the run diverged, on the same
numbers. The rest is the same on every rank already: the gradient norm is the all-reduced
gradients', and so whether an update was applied.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from transformer.training.state import TrainState

# The fields of `UpdateMeter.values`, in order. The first four are sums over the updates
# since the last read (loss, NLL and tokens only where the loss was finite, as the log
# window counts them); then the last update and the guard's streak; then the loss sum and
# tokens of this process's first update (written once).
FIELDS = ("loss_sum", "nll_sum", "tokens", "applied", "grad_norm", "last_applied", "streak",
          "worst_streak", "bad_loss", "bad_grad_norm", "first_loss_sum", "first_tokens")
_SUMS = 4
_STREAK, _WORST = FIELDS.index("streak"), FIELDS.index("worst_streak")
_FIRST = FIELDS.index("first_loss_sum")
# Each rank's own: summed over the ranks at a read (`bad_loss`, per token, then averaged)
_PER_RANK = [FIELDS.index(f) for f in ("loss_sum", "nll_sum", "tokens", "bad_loss", "first_loss_sum", "first_tokens")]


class UpdateMeter:
    """Device-side record of the updates since the last read.

    Args:
        device: where the updates run.
        world_size: the ranks training (DDP), each with a meter like this one.
    """

    def __init__(self, device: torch.device, world_size: int = 1) -> None:
        self.dtype = torch.float32 if device.type == "mps" else torch.float64  # mps has no float64
        self.values = torch.zeros(len(FIELDS), dtype=self.dtype, device=device)
        self.world_size = world_size
        self.per_rank = torch.tensor(_PER_RANK, device=device)
        self.pending = 0  # updates added since the last read (the host knows this much)
        self.added = 0  # updates added in all

    def add(self, metrics: dict, counts: torch.Tensor) -> None:
        """Add one update: `metrics` as `Trainer.train_step` returns them (`loss_sum`,
        `nll_sum`, `grad_norm` and `applied` device tensors, `tokens` an int); `counts`, a
        device bool, whether a skip counts toward divergence (`DivergenceGuard.counts`)."""
        v, dt = self.values, self.dtype
        loss, nll = metrics["loss_sum"].to(dt), metrics["nll_sum"].to(dt)
        norm, applied, tokens = metrics["grad_norm"].to(dt), metrics["applied"], metrics["tokens"]
        finite = torch.isfinite(loss)
        streak = torch.where(applied, 0.0, v[_STREAK] + counts.to(dt))
        first = (loss, loss.new_full((), tokens)) if self.added == 0 else (v[_FIRST], v[_FIRST + 1])
        self.values = torch.stack([
            v[0] + torch.where(finite, loss, 0.0),
            v[1] + torch.where(finite, nll, 0.0),
            v[2] + finite.to(dt) * tokens,
            v[3] + applied.to(dt),
            norm,
            applied.to(dt),
            streak,
            torch.maximum(v[_WORST], streak),
            torch.where(applied, v[8], loss / max(tokens, 1)),
            torch.where(applied, v[9], norm),
            *first,
        ])
        self.pending += 1
        self.added += 1

    def read(self) -> dict[str, float]:
        """The record as host numbers (the one read), every rank's losses and tokens summed,
        plus `updates`, the updates it covers; then a new window: the sums restart, the
        streak goes on. Under DDP every rank must read at the same update (the trainer's
        reads fall on the same updates on every rank)."""
        values = self.values
        if self.world_size > 1:
            ranks = values.index_select(0, self.per_rank)
            dist.all_reduce(ranks)
            values = values.index_copy(0, self.per_rank, ranks)
        reading = dict(zip(FIELDS, values.tolist()))
        reading["bad_loss"] /= self.world_size  # a mean over the ranks of a loss per token
        reading["updates"] = self.pending
        self.values[:_SUMS] = 0.0
        self.values[_WORST] = self.values[_STREAK]
        self.pending = 0
        return reading

    def read_and_recount(self, state: TrainState) -> dict[str, float]:
        """`read`, and take the updates it found skipped off `state.step` (each was counted
        as applied) into `state.skipped_steps`."""
        reading = self.read()
        skipped = reading["updates"] - int(reading["applied"])
        state.step -= skipped
        state.skipped_steps += skipped
        return reading
