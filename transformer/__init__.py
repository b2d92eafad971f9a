"""Italian→English neural machine translation with the Transformer of Vaswani et al. (2017).

The names a Python user needs, at the top:

    from transformer import Transformer, Translator

They load on first use (PEP 562's module `__getattr__`), so that `import transformer`
stays cheap and free of torch: `deploy/serving.py` and `deploy/serve_checks.py` are
imported inside LibreTranslate's own venv, where only the standard library is sure to be,
and the OpenMP setting below must be made before torch loads.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# OpenMP threads that finish their work spin for a while before they sleep. On a machine
# shared with other work, two torch threads spinning against another process ran up to 10x
# slower; sleeping at once (PASSIVE) cost an uncontended run nothing measurable
# (scripts/bench_omp_wait.py; docs/performance.md, "OMP_WAIT_POLICY"). OpenMP reads the
# variable once, when torch loads it, so it is set here, before the `mt-*` commands import
# torch, and only if the user has not chosen (OMP_WAIT_POLICY=ACTIVE keeps the spinning) and
# torch is not loaded.
if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# name -> the module that defines it, imported when the name is first asked for
_LAZY = {
    "Transformer": "transformer.model.transformer",
    "Translator": "transformer.decoding.translator",
}
__all__ = ["Transformer", "Translator", "__version__"]

if TYPE_CHECKING:  # what type checkers and editors see; never runs
    from transformer.decoding.translator import Translator
    from transformer.model.transformer import Transformer


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # the next look-up finds it without this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
