"""What every `mt-*` command shares: config to dataclass, one-line user errors, logging.

Each command is a Hydra app (or, for mt-average, argparse): its `@hydra.main` function
hands the composed config to `run_command(prog, Schema, cfg, job)`, and the console
script runs that function through `hydra_entry`. A user's mistake (a bad
setting, a missing or corrupt file, a misaligned corpus, a checkpoint that does not fit)
ends the command with one line, `prog: error: ...`, and exit status 1, before any work
starts where it can be known then; so does a usage error (mt-average's too). A traceback
is for bugs (any exception that is not a `errors.UserError` or OmegaConf's): set
`MT_TRACEBACK=1` to see one for a user error too.

Every setting's default and help text live once, in the dataclasses (`transformer/config.py`
and each command's config): `register_configs` stores each group's dataclass in Hydra's
ConfigStore as `schema/<group>` (and `TrainConfig` as `schema/train`), and each
`configs/<group>/*.yaml` starts from it and holds only what that preset changes. It runs
when this module is imported, so every `mt-*` command composes against it; `hydra_entry`
adds the command's own dataclass (`schema/translate`: `configs/translate.yaml` starts from
it). Tests compose through `helpers.compose_cfg`, which registers the same.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException, ValidationError

from transformer.commands import help, overrides
from transformer.config import GROUPS, TrainConfig, omegaconf_error_line, to_dataclass
from transformer.errors import UserError, file_error
from transformer.paths import PROJECT_ROOT

CONFIG_PATH = str(PROJECT_ROOT / "configs")  # absolute: see the note in `hydra_main` users
# User errors: the project's own (`errors.UserError`: bad settings, bad data, bad
# checkpoints, outputs that may not be written, files the user named that cannot be read
# or written, a learning rate that makes training diverge) and OmegaConf's, which name a
# key of the config. Any other exception is a bug and keeps its traceback.
USER_ERRORS = (UserError, OmegaConfBaseException)
TRACEBACK_ENV = "MT_TRACEBACK"

C = TypeVar("C")
R = TypeVar("R")


def _dirname(text: str) -> str:
    """A string as one directory name: no path separators, at most 200 characters. A longer
    one (an Optuna trial sets a dozen keys) keeps its first 187 and a digest of the whole:
    cut short alone, two jobs that differ only further on would share a run directory."""
    text = _as_typed(text)
    name = text.replace("/", "_").replace("\\", "_")
    if len(name) <= 200:
        return name
    return f"{name[:187]}~{hashlib.sha256(text.encode()).hexdigest()[:12]}"


# A job's overrides, as Hydra joins them (sorted, comma-separated) for its directory name.
_ITEM_START = re.compile(r",(?=[~+]*[A-Za-z_][\w.]*(?:=|,|$))")
_MADE_MISSING = re.compile(r"([A-Za-z_][\w.]*)=" + re.escape(overrides.MISSING))


def _as_typed(text: str) -> str:
    """The overrides `overrides.rewrite` turned from `~key` into `key='???'` (a reset, or a
    mix emptied) named as Hydra's sweeper named the typed deletion, `~key=null`, so that a
    sweep job's directory keeps the name it had before the groups had dataclass schemas
    (an old sweep resumes into it)."""
    items = _ITEM_START.split(text)
    if not any(_MADE_MISSING.fullmatch(item) for item in items):
        return text
    typed = [f"~{m[1]}=null" if (m := _MADE_MISSING.fullmatch(item)) else item for item in items]
    return ",".join(sorted(typed))


# configs/train.yaml names each sweep job's directory after its overrides with this.
OmegaConf.register_new_resolver("dirname", _dirname, replace=True)

SCHEMAS = GROUPS  # config group -> the dataclass its presets start from


def register_configs() -> None:
    """Store each group's dataclass in Hydra's ConfigStore as the config `schema/<group>`,
    and `TrainConfig` as `schema/train`.

    A preset's defaults list starts with `/schema/<group>@_here_`: its keys, defaults and
    types are the dataclass's, and the YAML sets only what the preset changes. The schemas
    are a group of their own, not options of the groups, so `model=...` offers the same
    presets as before. Idempotent: a second call stores the same nodes again.
    """
    for group, schema in SCHEMAS.items():
        register_command(group, schema)
    register_command("train", TrainConfig)


def register_command(name: str, schema: type) -> None:
    """Store a command's dataclass as `schema/<name>`: `configs/<name>.yaml` starts from it."""
    ConfigStore.instance().store(group="schema", name=name, node=schema)


register_configs()


_NO_SUCH_KEY = re.compile(r"Could not override '(?P<key>[^']+)'\. To append to your config use \S+ "
                          r"(?P<why>Key '[^']+' not in '\w+')")


def error_message(e: BaseException) -> str:
    """One line for a user error: OmegaConf's errors span several lines; name their key."""
    cause = e.__cause__
    if isinstance(e, HydraException) and isinstance(cause, ValidationError) and getattr(cause, "full_key", None):
        return error_message(cause)  # a value of the wrong type: named as `to_dataclass` names it
    if isinstance(e, OverrideParseException) and "=" in (e.override or ""):
        return _unreadable_override(e.override)
    if isinstance(e, HydraException):  # the command line itself: an unknown key, a bad group
        parts = [str(e), str(e.__cause__ or "")]
        lines = [line.strip() for part in parts for line in part.split("Config search path")[0].splitlines()]
        text = " ".join(line for line in lines if line and not line.startswith(("full_key:", "object_type=", "reference_type=")))
        # A misspelt key of a dataclass: Hydra's hint to append it with `+` would be refused too.
        if m := _NO_SUCH_KEY.fullmatch(text):
            return f"{m['key']}: {m['why']}"
        return text
    if isinstance(e, OmegaConfBaseException):
        return omegaconf_error_line(e)
    return " ".join(str(e).split()) or type(e).__name__


def _unreadable_override(override: str) -> str:
    """An override Hydra's grammar cannot read (an accented letter in a list, a stray
    quote), with how to quote it in the shell."""
    key, _, value = override.partition("=")
    if value.startswith("[") and value.endswith("]") and '"' not in value:  # each item quoted
        quoted = "[" + ", ".join(f'"{v.strip()}"' for v in value[1:-1].split(",")) + "]"
    else:
        quoted = f'"{value}"'
    shell = f"'{key}={quoted}'" if "'" not in quoted else '"' + f"{key}={quoted}".replace('"', '\\"') + '"'
    return (f"{override}: Hydra cannot read this value: put it in quotes, and the whole "
            f"setting in quotes for the shell: {shell}")


def run(prog: str, job: Callable[[], R]) -> R:
    """Run `job`; a user error or Ctrl-C exits with one line (status 1, or 130 for Ctrl-C)."""
    try:
        return job()
    except USER_ERRORS as e:
        if os.environ.get(TRACEBACK_ENV):
            raise
        sys.exit(f"{prog}: error: {error_message(e)}")
    except KeyboardInterrupt:
        if os.environ.get(TRACEBACK_ENV):
            raise
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(130)


def hydra_entry(prog: str, hydra_main: Callable[[], object], schema: type | None = None) -> None:
    """Run a `@hydra.main` function so that mistakes on the command line itself (an unknown
    key, a missing config group option) end in one line too, like those `run` catches.

    Hydra prints such errors over several lines unless HYDRA_FULL_ERROR is set, in which
    case it raises them: set here, they are caught and shortened. A user who sets
    HYDRA_FULL_ERROR or MT_TRACEBACK gets Hydra's traceback. The command's `schema` is
    registered as `schema/<command>` (`configs/<command>.yaml` starts from it), and the
    overrides Hydra would take otherwise than meant are rewritten first
    (`overrides.rewrite`: a mix replaced, a null setting deleted, a comma in a text).
    """
    if schema is not None:  # configs/<command>.yaml starts from it
        register_command(prog.removeprefix("mt-"), schema)
    argv = sys.argv
    if schema is not None and help.asked(argv[1:]):  # our help, not Hydra's bare YAML
        given = overrides.rewrite(help.without_flags(argv[1:]), schema)
        about = help.usage(sys.modules[hydra_main.__module__].__doc__)
        try:
            print(help.help_text(prog, prog.removeprefix("mt-"), schema, given, about), end="")
        except (HydraException, OmegaConfBaseException, UserError) as e:
            sys.exit(f"{prog}: error: {error_message(e)}")
        return
    sys.argv = [argv[0], *overrides.rewrite(argv[1:], schema)]
    try:
        if os.environ.get("HYDRA_FULL_ERROR") or os.environ.get(TRACEBACK_ENV):
            hydra_main()
            return
        os.environ["HYDRA_FULL_ERROR"] = "1"
        try:
            hydra_main()
        except (HydraException, OmegaConfBaseException, UserError) as e:
            sys.exit(f"{prog}: error: {error_message(e)}")
        finally:
            del os.environ["HYDRA_FULL_ERROR"]
    finally:
        sys.argv = argv


def run_command(prog: str, schema: type[C], cfg: DictConfig, job: Callable[[C], object]) -> None:
    """Check `cfg` against `schema` (types and ranges) and run `job`, as `run` does.

    Logging goes to stderr as `prog: LEVEL: message`.
    """
    setup_logging(prog)
    run(prog, lambda: job(to_dataclass(schema, cfg)))


def setup_logging(prog: str | None = None, log_file: Path | None = None, is_main: bool = True) -> None:
    """Log to stderr (and to `log_file`) on rank 0; only warnings on other ranks.

    With `prog`, lines read `prog: LEVEL: message` (the inference commands); without, they
    carry a time stamp and the logger's name (training, whose log is kept in a file).
    """
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file is not None and is_main:
        try:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            handlers.append(logging.FileHandler(log_file))
        except OSError as e:
            raise file_error(e, log_file, "write the log") from e
    fmt = f"{prog}: %(levelname)s: %(message)s" if prog else \
        "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.INFO if is_main else logging.WARNING, format=fmt,
                        handlers=handlers, force=True)
