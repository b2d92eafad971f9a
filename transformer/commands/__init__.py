"""The `mt-*` commands: Hydra entry points, and what they share.

One module per command (`train.py` is `mt-train`, `translate.py` `mt-translate`, and
`evaluate`, `prepare`, `average`, `export`, `masks`); `cli.py` is what every command
shares (a config to its dataclass, one-line user errors, logging), `overrides.py` the
command-line overrides Hydra would read otherwise than a user means them, `sweep.py`
`mt-train -m`'s Optuna study. Hydra is imported here and nowhere below.

May import: every other layer; nothing imports it.
"""

from __future__ import annotations

import os
import sys

# OpenMP threads that finish their work spin for a while before they sleep. On a machine
# shared with other work, two torch threads spinning against another process run much
# slower; sleeping at once (PASSIVE) costs an uncontended run little
# (scripts/bench/bench_omp_wait.py, docs/performance.md "OMP_WAIT_POLICY"). OpenMP reads the
# variable once, when torch loads it, so it is set here, when a command's module is first
# imported and before it imports torch; only if the user has not chosen
# (OMP_WAIT_POLICY=ACTIVE keeps the spinning) and torch is not loaded. A command owns its
# process; `import transformer` (a library user's process) changes nothing.
if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
