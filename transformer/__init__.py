"""Italian→English neural machine translation with the Transformer of Vaswani et al. (2017).

The names a Python user needs, at the top:

    from transformer import Transformer, Translator, Translation
    from transformer import UserError, ConfigError, CheckpointError   # the errors it raises

They load on first use (PEP 562's module `__getattr__`), so that `import transformer`
stays cheap and free of torch: `deploy/serving.py` and `deploy/serve_checks.py` are
imported inside LibreTranslate's own venv, where only the standard library is sure to be.
Importing the package changes nothing in the process (no environment variable, no
thread count, no allocator option): the `mt-*` commands, which own their process, set
what they need (`transformer/commands/__init__.py`).

Every error the project raises for a user's mistake derives from `UserError` (and the
standard class it is also: `ConfigError` is a `ValueError`, `UserFileError` an `OSError`;
`transformer/errors.py`); the others name what went wrong where: a checkpoint, a corpus,
a tokenizer, an output path, a run directory, an export, a diverged training run.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# name -> the module that defines it, imported when the name is first asked for
_LAZY = {
    "Transformer": "transformer.model.transformer",
    "Translator": "transformer.decoding.translator",
    "Translation": "transformer.decoding.translator",
    "UserError": "transformer.errors",
    "ConfigError": "transformer.errors",
    "UserFileError": "transformer.errors",
    "CheckpointError": "transformer.checkpoint",
    "DataError": "transformer.data.corpus",
    "VocabularyError": "transformer.data.tokenizer",
    "OutputError": "transformer.outputs",
    "RunDirError": "transformer.training.run_dir",
    "ExportError": "transformer.deploy.ct2_export",
    "TrainingDiverged": "transformer.training.nan_guard",
}
__all__ = [  # every name of _LAZY (a test checks), spelt out for linters and type checkers
    "CheckpointError", "ConfigError", "DataError", "ExportError", "OutputError", "RunDirError",
    "TrainingDiverged", "Transformer", "Translation", "Translator", "UserError", "UserFileError",
    "VocabularyError", "__version__",
]

if TYPE_CHECKING:  # what type checkers and editors see; never runs
    from transformer.checkpoint import CheckpointError
    from transformer.data.corpus import DataError
    from transformer.data.tokenizer import VocabularyError
    from transformer.decoding.translator import Translation, Translator
    from transformer.deploy.ct2_export import ExportError
    from transformer.errors import ConfigError, UserError, UserFileError
    from transformer.model.transformer import Transformer
    from transformer.outputs import OutputError
    from transformer.training.nan_guard import TrainingDiverged
    from transformer.training.run_dir import RunDirError


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # the next look-up finds it without this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
