"""Command-line overrides that Hydra would take otherwise than a user means them.

`cli.hydra_entry` passes the command line through `rewrite` before Hydra reads it:
- `data.corpora={tatoeba: 1}` (or `+data.corpora=...`) replaces the mix: Hydra merges a
  dict into the one the config holds, so `europarl: 1` would stay. It becomes
  `data.corpora='???' ++data.corpora={tatoeba: 1}`: emptied (a setting of a dataclass
  schema cannot be deleted, but it can be made missing), then filled.
  `data.corpora.opus100=1` adds a corpus
  to a mix without Hydra's `+` (`++data.corpora.opus100=1`): the corpora are a dict
  whose keys the user chooses, and `DataConfig.validate` names the ones it takes.
- `~trainer.max_hours` deletes a setting: deleting a setting gives it its default, so it
  becomes `trainer.max_hours=null` (the dataclass's default, whatever the value composed).
  Hydra would refuse the deletion itself: the groups' schemas are dataclasses (their
  settings cannot be deleted), and a null setting "does not exist" for it. A setting
  whose default is a list, a dict or a dataclass (`~optim.betas`, `~data.phases`,
  `~input`) becomes `optim.betas='???'`: missing, so `to_dataclass` fills in the default.
  `~model` stays: Hydra drops the group, and the command's schema gives its defaults.
  `~key=value` resets the setting the same way, whatever it holds: Hydra would delete it
  only if it held `value`, but it cannot delete a schema's setting at all, and the
  composed value is not known yet when the command line is read.
- `test_set=src.it,ref.en`, a comma in a text setting of a single run, is that text:
  Hydra would call it ambiguous (a list? a sweep?); it is quoted for it.
- `input.file=dir/città.it`, a value with a letter outside ASCII (with or without a
  space): Hydra's grammar takes only ASCII in a value it is not told is quoted, and
  stops at the `à` (LexerNoViableAltException); the value is quoted for it,
  `input.file='dir/città.it'`. Not a value Hydra reads as a list, a dict, a sweep or a
  function (`[`, `{`, `,`, `(`) or one with a quote: `cli.error_message` says how to
  quote those.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from transformer.config import GROUPS

# Hydra's own flags that take the next argument as their value.
_FLAGS_WITH_VALUE = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd",
                     "--package", "-p", "--cfg", "-c", "--experimental-rerun"}
_MIX = "data.corpora"
# A setting made missing (`key='???'`): the default, for `to_dataclass`; emptied, for a mix.
MISSING = "'???'"


def rewrite(argv: list[str], schema: type | None) -> list[str]:
    """The command line (without the program) as Hydra should read it; see the module."""
    if schema is None:
        return list(argv)
    multirun = "-m" in argv or "--multirun" in argv
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip or arg.startswith("-"):
            skip = arg in _FLAGS_WITH_VALUE
            out.append(arg)
            continue
        out += _rewrite_one(arg, schema, multirun)
    return out


def _rewrite_one(arg: str, schema: type, multirun: bool) -> list[str]:
    if arg.startswith("~"):  # `~key`, or `~key=value` (deleted if it holds value)
        key, eq, _ = arg[1:].partition("=")
        found = _field(schema, key)
        literal = _literal(found[1]) if found else None
        if found is None or key in GROUPS:
            # not a setting of the schema (a mix's corpus): Hydra deletes it; a group
            # (`~model`): Hydra drops it from the defaults list, and the schema's defaults stay
            return [arg]
        return [f"{key}={literal if literal is not None else MISSING}"]
    key, eq, value = arg.partition("=")
    if not eq or key.startswith("hydra."):
        return [arg]
    bare = key.lstrip("+")
    if bare == _MIX and _field(schema, _MIX):
        return [f"{_MIX}={MISSING}", f"++{_MIX}={value}"]
    if bare.startswith(f"{_MIX}.") and not key.startswith("+") and _field(schema, _MIX):
        return [f"++{arg}"]
    found = _field(schema, bare)
    if (found and not multirun and _is_text(found[0]) and "," in value
            and not value.startswith(("'", '"', "[", "{")) and "'" not in value):
        return [f"{key}='{value}'"]
    if _plain_text_beyond_ascii(value):
        return [f"{key}='{value}'"]
    return [arg]


def _plain_text_beyond_ascii(value: str) -> bool:
    """A value with a letter outside ASCII (`città`) that is a text as typed: no quotes,
    list, dict, sweep or function Hydra would read in it, no escape at its end."""
    return (not value.isascii() and not value.startswith(("[", "{"))
            and not any(c in value for c in "'\",()") and not value.endswith("\\"))


def _field(schema: type, dotted: str) -> tuple[Any, Any] | None:
    """(type, default) of the dataclass field `dotted` (e.g. trainer.max_hours), or None."""
    obj: Any = schema()
    hint: Any = None
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(obj) or part not in {f.name for f in dataclasses.fields(obj)}:
            return None
        hint = typing.get_type_hints(type(obj))[part]
        obj = getattr(obj, part)
    return hint, obj


def _is_text(hint: Any) -> bool:
    """str, or str | None."""
    if hint is str:
        return True
    args = set(typing.get_args(hint))
    return typing.get_origin(hint) in (typing.Union, types.UnionType) and str in args <= {str, type(None)}


def _literal(value: Any) -> str | None:
    """A default as Hydra's override grammar writes it; None for one it cannot (a list,
    a nested config)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str) and "'" not in value:
        return f"'{value}'"
    return None
