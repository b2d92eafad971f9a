"""Stopping a training run on SIGINT/SIGTERM with a checkpoint: `StopSignal` catches both
while training runs, so that the first one lets the current update finish and the loop save
a checkpoint and exit cleanly, a second one (while the first waits) ends the process at once
saving nothing, and the handlers that were there before are put back when training ends.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignal:
    """Once installed (`install`, or inside `with`), SIGINT and SIGTERM set `received` (the
    first one's number) instead of stopping the process; a second one ends it at once, exit
    status 128 + its number, without saving (a checkpoint being written then stays a leftover
    that the next start clears away). `restore` (leaving `with`) puts the previous handlers
    back.

    Args:
        ckpt_dir: the run's checkpoint folder, named in the second signal's message.
    """

    def __init__(self, ckpt_dir: Path) -> None:
        self.ckpt_dir = ckpt_dir
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """Catch SIGINT and SIGTERM from now on (in the main thread only, as Python's `signal`)."""
        if self._previous:  # installed already: what it replaced is what to put back
            return
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        """Put back the handlers `install` replaced; `received` keeps the signal caught."""
        for sig, handler in self._previous.items():
            if handler is not None:  # None: not installed from Python, cannot be put back
                signal.signal(sig, handler)
        self._previous.clear()

    def __enter__(self) -> StopSignal:
        self.install()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.restore()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.received is not None:
            print(f"mt-train: second {name}: stopping now without saving; the checkpoints "
                  f"in {self.ckpt_dir} are as they were", file=sys.stderr, flush=True)
            os._exit(128 + signum)
        self.received = signum
        print(f"mt-train: {name}: finishing this update, then saving a checkpoint; send it "
              "again to stop at once without saving", file=sys.stderr, flush=True)
