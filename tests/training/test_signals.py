"""Stopping on SIGINT/SIGTERM: the first signal only sets the stop flag (the process goes on
to save), the second ends the process at once with 128 + its number, and the handlers that
were there before training are put back after it."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from transformer.paths import PROJECT_ROOT
from transformer.training.signals import StopSignal


@pytest.fixture
def own_handlers():
    """SIGINT and SIGTERM handlers of this test's own, put back as pytest had them after it."""
    calls = []

    def previous(signum, frame):
        calls.append(signum)

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in saved:
        signal.signal(sig, previous)
    yield previous, calls
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_sets_the_stop_flag_and_the_previous_handlers_come_back(tmp_path, own_handlers, sig):
    previous, calls = own_handlers
    stop = StopSignal(tmp_path / "checkpoints")
    with stop:
        assert stop.received is None
        signal.raise_signal(sig)  # the process goes on: the loop saves, then stops
        assert stop.received == sig
    assert stop.received == sig  # still there for the caller (a sweep stops its study)
    assert signal.getsignal(signal.SIGINT) is previous and signal.getsignal(signal.SIGTERM) is previous
    signal.raise_signal(sig)
    assert calls == [sig]  # the previous handler, not the stop flag, has it now


def test_installing_twice_still_restores_the_handlers_from_before(tmp_path, own_handlers):
    previous, _ = own_handlers
    stop = StopSignal(tmp_path / "checkpoints")
    stop.install()
    stop.install()
    stop.restore()
    assert signal.getsignal(signal.SIGTERM) is previous and signal.getsignal(signal.SIGINT) is previous
    stop.restore()  # a second restore changes nothing
    assert signal.getsignal(signal.SIGTERM) is previous


SECOND_SIGNAL = textwrap.dedent("""
    import signal, sys
    sys.path.insert(0, {root!r})
    from pathlib import Path
    from transformer.training.signals import StopSignal
    with StopSignal(Path("run") / "checkpoints") as stop:
        signal.raise_signal(signal.SIGTERM)
        print("first", stop.received, flush=True)
        signal.raise_signal(signal.SIGTERM)
        print("still running", flush=True)
""")


def test_a_second_signal_ends_the_process_at_once(tmp_path):
    code = SECOND_SIGNAL.format(root=str(PROJECT_ROOT))
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert proc.stdout.splitlines() == [f"first {int(signal.SIGTERM)}"]
    assert "mt-train: SIGTERM: finishing this update, then saving a checkpoint" in proc.stderr
    assert ("mt-train: second SIGTERM: stopping now without saving; the checkpoints in "
            "run/checkpoints are as they were") in proc.stderr
