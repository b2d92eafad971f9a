"""What the updates did, kept on the device and read once per log line: `UpdateMeter`.

Inside an update nothing is read back to the host (on a GPU each read stops the host until
the device has caught up, and the host can no longer queue the next update ahead). So each
update's loss and NLL sums, token count, gradient norm and whether it was applied are
added up here in device tensors, and the divergence guard's count of skipped updates in a
row is kept here too; the trainer reads them all at once (`read`, one transfer of ten
numbers) when it logs, validates, saves or stops.
"""

from __future__ import annotations

import torch

from transformer.training.state import TrainState

# The fields of `UpdateMeter.values`, in order. The first four are sums over the updates
# since the last read (loss, NLL and tokens only where the loss was finite, as the log
# window counts them); the rest describe the last update and the guard's streak.
FIELDS = ("loss_sum", "nll_sum", "tokens", "applied", "grad_norm", "last_applied", "streak",
          "worst_streak", "bad_loss", "bad_grad_norm")
_SUMS = 4
_STREAK, _WORST = FIELDS.index("streak"), FIELDS.index("worst_streak")


class UpdateMeter:
    """Device-side record of the updates since the last read.

    Args:
        device: where the updates run.
    """

    def __init__(self, device: torch.device) -> None:
        self.dtype = torch.float32 if device.type == "mps" else torch.float64  # mps has no float64
        self.values = torch.zeros(len(FIELDS), dtype=self.dtype, device=device)
        self.pending = 0  # updates added since the last read (the host knows this much)

    def add(self, metrics: dict, counts: torch.Tensor) -> None:
        """Add one update: `metrics` as `Trainer.train_step` returns them (`loss_sum`,
        `nll_sum`, `grad_norm` and `applied` device tensors, `tokens` an int); `counts`, a
        device bool, whether a skip counts toward divergence (`DivergenceGuard.counts`)."""
        v, dt = self.values, self.dtype
        loss, nll = metrics["loss_sum"].to(dt), metrics["nll_sum"].to(dt)
        norm, applied, tokens = metrics["grad_norm"].to(dt), metrics["applied"], metrics["tokens"]
        finite = torch.isfinite(loss)
        streak = torch.where(applied, 0.0, v[_STREAK] + counts.to(dt))
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
        ])
        self.pending += 1

    def read(self) -> dict[str, float]:
        """The record as host numbers (the one read), plus `updates`, the updates it
        covers; then a new window: the sums restart, the streak goes on."""
        reading = dict(zip(FIELDS, self.values.tolist()))
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
