"""A log line every few seconds while a long preparation step runs: `Heartbeat`.

Training the SentencePiece vocabulary is one call into SentencePiece's C++ that prints
nothing (minutes on a large corpus), and encoding a corpus goes chunk by chunk with no bar
of its own. While either runs, a thread logs what it is doing and how far it has come,
every `HEARTBEAT_SECONDS`; a step done sooner logs nothing. SentencePiece releases the
GIL while it trains, so the thread's lines come on time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 10.0


class Heartbeat:
    """Log `status()` with the time so far, every `every` seconds, until the `with` block ends.

        with Heartbeat(lambda: f"encoding train: {done:,} of {total:,} pairs"):
            ...
    """

    def __init__(self, status: Callable[[], str], every: float | None = None,
                 logger: logging.Logger = log) -> None:
        self.status, self.logger = status, logger
        self.every = HEARTBEAT_SECONDS if every is None else every
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._done.wait(self.every):
            self.logger.info("%s (%.0f s so far)", self.status(), time.monotonic() - self._start)
