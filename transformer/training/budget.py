"""What ends a training run, and when: `Budget`.

A run stops at the first of three limits: `trainer.max_steps` updates, `trainer.max_epochs`
epochs, `trainer.max_hours` of training time (validation and checkpoints not counted).
`Budget.stop` says whether one is reached; `Budget.end` estimates the update at which each
would end the run and gives the nearest, which the progress bar counts towards (its
total and ETA) and names:

- max_steps: that update.
- max_epochs: this update, plus the batches left in this epoch and in the epochs before
  the limit, over `accum_steps`; a later epoch is taken to hold as many batches as this
  one (every epoch draws as many pairs; a mix's phases draw them from other corpora,
  whose lengths differ), and the estimate is renewed as each epoch begins.
- max_hours: this update, plus the training time left over the training time an update
  has taken since the run (or its resume) started; none before the first update.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformer.config import TrainerConfig
from transformer.data.batching import TokenBatchSampler
from transformer.training.state import TrainState


@dataclass
class Budget:
    """The limits of a run (`trainer.*`) and what it has used of them since `start`.

    Args:
        tc: the trainer settings (max_steps, max_epochs, max_hours, accum_steps).
        sampler: this rank's batches: how many an epoch holds.
    """

    tc: TrainerConfig
    sampler: TokenBatchSampler
    first_step: int = 0
    first_seconds: float = 0.0
    _batches: dict[int, int] = field(default_factory=dict)  # an epoch's batches, counted once

    def start(self, state: TrainState) -> None:
        """Where this process's training starts (a resumed run's step and training time)."""
        self.first_step, self.first_seconds = state.step, state.train_seconds

    def describe(self) -> str:
        """The limits in force: `max_steps=2500, max_hours=2.0 (training time)`."""
        tc = self.tc
        limits = [f"max_steps={tc.max_steps}"]
        if tc.max_epochs is not None:
            limits.append(f"max_epochs={tc.max_epochs}")
        if tc.max_hours is not None:
            limits.append(f"max_hours={tc.max_hours:g} (training time)")
        return ", ".join(limits)

    def stop(self, state: TrainState, epoch: int) -> str | None:
        """The limit that ends the run before an update whose last batch is of `epoch`,
        as `max_epochs=3`; None while none is reached (max_steps is the loop's own)."""
        tc = self.tc
        if tc.max_epochs is not None and epoch >= tc.max_epochs:
            return f"max_epochs={tc.max_epochs}"
        if tc.max_hours is not None and state.train_seconds >= tc.max_hours * 3600:
            return f"max_hours={tc.max_hours:g}"
        return None

    def end(self, state: TrainState) -> tuple[int, str]:
        """(the update the run is expected to end at, the limit that ends it there): the
        nearest of the limits' estimates (module docstring)."""
        tc = self.tc
        ends = [(tc.max_steps, f"max_steps={tc.max_steps}")]
        if tc.max_epochs is not None:
            ends.append((state.step + self._batches_left(state) // tc.accum_steps,
                         f"max_epochs={tc.max_epochs}"))
        done = state.step - self.first_step
        if tc.max_hours is not None and done > 0:
            per_update = (state.train_seconds - self.first_seconds) / done
            left = max(0.0, tc.max_hours * 3600 - state.train_seconds)
            ends.append((state.step + round(left / max(per_update, 1e-9)), f"max_hours={tc.max_hours:g}"))
        final, limit = min(ends, key=lambda e: e[0])
        return max(final, state.step), limit

    def _batches_left(self, state: TrainState) -> int:
        """This rank's batches before epoch max_epochs begins."""
        epoch, last = state.epoch, self.tc.max_epochs or 0
        if epoch >= last:
            return 0
        if epoch not in self._batches:  # counted once an epoch (the sampler's plan of it)
            self._batches[epoch] = len(self.sampler.batches(epoch))
        now = self._batches[epoch]
        return max(now - state.batch_index, 0) + now * (last - epoch - 1)
