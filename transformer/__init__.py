"""Italian→English neural machine translation with the Transformer of Vaswani et al. (2017)."""

import os
import sys

__version__ = "0.1.0"

# OpenMP threads that finish their work spin for a while before they sleep. On a machine
# shared with other work, two torch threads spinning against another process ran up to 10x
# slower; sleeping at once (PASSIVE) cost an uncontended run nothing measurable
# (scripts/bench_omp_wait.py, README "Training speed"). OpenMP reads the variable once, when
# torch loads it, so it is set here, before the `mt-*` commands import torch, and only if
# the user has not chosen (OMP_WAIT_POLICY=ACTIVE keeps the spinning) and torch is not loaded.
if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
