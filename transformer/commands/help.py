"""`mt-* --help`: every setting a command reads, with its type, default and description.

The descriptions are the dataclass fields' docstrings (the string under each field of
`transformer/config.py` and of the commands' own configs), read from the source as the
API reference reads them: written once, never copied. The defaults are the command's as
composed (configs/<command>.yaml with the presets it chooses, and any override given
beside `--help`), so `mt-train --help` shows validation's greedy search where
`mt-translate --help` shows beam search. A command lists only the config groups it
composes: mt-translate's is `decode`, mt-train's are model, data, optim, trainer, decode
and the experiment, debug and hparams_search presets.

    mt-translate --help
    mt-train --help experiment=tatoeba_cpu        # that recipe's values as the defaults
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import shutil
import textwrap
import typing
from dataclasses import dataclass

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from transformer.paths import CONFIG_DIR

HELP_FLAGS = ("--help", "-h")


@dataclass(frozen=True)
class Setting:
    """One key a command reads: `decode.beam_size`, its type, its default, its description."""

    key: str
    type: str
    default: str
    doc: str


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal under its annotated assignment), as one
    paragraph; a field without one is left out."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, after in itertools.pairwise(body):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def nested_dataclass(cls: type, name: str) -> type | None:
    """The dataclass a field of `cls` holds (a group, `input`), or the one its list holds
    (`data.phases`); None for a plain value."""
    hint = typing.get_type_hints(cls)[name]
    for candidate in (hint, *typing.get_args(hint)):
        if dataclasses.is_dataclass(candidate):
            return candidate  # type: ignore[return-value]
    return None


def config_dataclasses(schema: type) -> list[type]:
    """`schema` and every dataclass its fields hold, nested ones included, each once."""
    found = [schema]
    for f in dataclasses.fields(schema):
        inner = nested_dataclass(schema, f.name)
        if inner is not None:
            found += [c for c in config_dataclasses(inner) if c not in found]
    return found


def settings(schema: type, composed: DictConfig, prefix: str = "") -> list[Setting]:
    """Every key of `schema` (a group's fields under its name), in the dataclass's order,
    with the default `composed` gives it."""
    out = []
    docs = field_docs(schema)
    for f in dataclasses.fields(schema):
        key = f"{prefix}{f.name}"
        inner = nested_dataclass(schema, f.name)
        value = composed.get(f.name) if isinstance(composed, DictConfig) else None
        if inner is not None and isinstance(value, DictConfig):
            out += settings(inner, value, f"{key}.")
            continue
        kind = _type_name(str(f.type))
        if inner is not None:  # a list of them (data.phases): named by their keys, as typed
            kind = kind.replace(inner.__name__, "{" + ", ".join(g.name for g in dataclasses.fields(inner)) + "}")
        out.append(Setting(key, kind, _yaml(composed, f.name), docs.get(f.name, "")))
    return out


def _type_name(annotation: str) -> str:
    """An annotation as a user types its values: `int | None` -> `int or null`."""
    return annotation.replace(" | None", " or null").replace("None | ", "null or ")


def _yaml(node: DictConfig, name: str) -> str:
    """A composed value as it would be typed on the command line (unresolved: `${now:...}`
    stays as written)."""
    if OmegaConf.is_missing(node, name):
        return "???"
    return _flow(OmegaConf.to_container(node, resolve=False)[name])  # type: ignore[index]


def _flow(value: object) -> str:
    """YAML's flow style, as Hydra reads an override: `null`, `true`, `[0.9, 0.98]`,
    `{tatoeba: 1}`."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    return str(value)


def compose_for_help(config_name: str, overrides: list[str]) -> tuple[DictConfig, dict[str, str | None]]:
    """The command's config as it would run with `overrides`, and the option each config
    group it composes chose (Hydra's own groups left out). Its schema must be stored
    (`cli.register_command`, as `cli.hydra_entry` does)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
        choices = {group: choice for group, choice in cfg.hydra.runtime.choices.items()
                   if not group.startswith("hydra/")}
        options = {group: GlobalHydra.instance().config_loader().get_group_options(group)
                   for group in choices}
    cfg = OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"])
    return cfg, {group: _options(options[group], choice) for group, choice in choices.items()}


def _options(options: list[str], chosen: str | None) -> str:
    """A group's options, the chosen one marked: `beam (chosen), greedy`."""
    named = [f"{o} (chosen)" if o == chosen else o for o in options]
    return ", ".join(named) + ("; none chosen" if chosen is None else "")


def help_text(prog: str, config_name: str, schema: type, overrides: list[str],
              about: str | None = None, width: int | None = None) -> str:
    """What `prog --help` prints: `about` (the command's module docstring: what it does
    and examples), its config groups with their options, and every setting with its type,
    default and description."""
    width = width or min(shutil.get_terminal_size().columns, 100)
    cfg, groups = compose_for_help(config_name, overrides)
    order = [f.name for f in dataclasses.fields(schema) if f.name in groups]
    order += [g for g in reversed(groups) if g not in order]
    lines = [f"usage: {prog} [KEY=VALUE ...] [GROUP=OPTION ...]   (Hydra overrides; "
             "--hydra-help: Hydra's own flags)", ""]
    if about:
        summary, *examples = about.split("\n\n")
        lines += [*textwrap.wrap(summary, width), "", *examples, ""]
    if order:
        lines.append("config groups (GROUP=OPTION; the presets in configs/GROUP/):")
        lines += [f"  {g:<15} {groups[g]}" for g in order]
        lines.append("")
    lines.append("settings (KEY=VALUE; type = default):")
    for s in settings(schema, cfg):
        lines.append(f"  {s.key}: {s.type} = {s.default}")
        lines += textwrap.wrap(s.doc, width, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(lines) + "\n"


def reference_markdown(groups: type, commands: dict[str, type]) -> str:
    """docs/configuration.md: the settings of each config group of `groups` (TrainConfig:
    model, data, optim, trainer, decode), then each command's own, as Markdown tables of
    key, type, the dataclass's default and its description."""
    group_of = {nested_dataclass(groups, f.name): f.name for f in dataclasses.fields(groups)}
    out = [REFERENCE_HEAD]
    for cls, name in group_of.items():
        out += [f"## `{name}` ({cls.__name__})", "", *_table(settings(cls, OmegaConf.structured(cls), f"{name}.")), ""]
    for prog, schema in commands.items():
        fields = {f.name: nested_dataclass(schema, f.name) for f in dataclasses.fields(schema)}
        shared = [(group_of[cls], cls.__name__) for cls in fields.values() if cls in group_of]
        rows = [s for s in settings(schema, OmegaConf.structured(schema))
                if fields[s.key.split(".")[0]] not in group_of]
        out += [f"## `{prog}` ({schema.__name__})", ""]
        if shared:
            links = ", ".join(f"[`{g}`](#{g}-{cls.lower()})" for g, cls in shared)
            out += [f"It reads the config group{'s' if len(shared) > 1 else ''} {links}"
                    + (", and these settings of its own:" if rows else ", and no setting of its own."), ""]
        out += [*_table(rows), ""] if rows else []
    return "\n".join(out).rstrip() + "\n"


REFERENCE_HEAD = """# Configuration reference

Every setting of every `mt-*` command: its key, its type, its default as the dataclass
defines it, and its description, from the docstrings in `transformer/config.py` and the
commands' own configs: the text `mt-<command> --help` prints. `mt-train` reads the five
config groups below (`model`, `data`, `optim`, `trainer`, `decode`); the other commands
read some of them and settings of their own. A preset or a recipe changes some defaults
(`model=base`, `experiment=tatoeba_cpu`); `--help` beside it shows the values it composes
to: `mt-train --help experiment=tatoeba_cpu`. A key is set on the command line as
`KEY=VALUE` ([Train a model](training.md#settings-groups-presets-and-overrides)).

This page is generated, `python scripts/config_reference.py > docs/configuration.md`, and a
test fails when it differs from the dataclasses.
"""


def _cell(text: str) -> str:
    """Text for a Markdown table cell: a `|` escaped."""
    return text.replace("|", "\\|")


def _table(rows: list[Setting]) -> list[str]:
    """A Markdown table of `rows`: key, type, default, description."""
    return ["| key | type | default | description |", "|---|---|---|---|",
            *(f"| `{s.key}` | {_cell(s.type)} | `{_cell(s.default)}` | {_cell(s.doc)} |" for s in rows)]


COMMAND_START = ("mt-", "echo ", "torchrun ", "python ")  # an example line's first word


def usage(docstring: str | None) -> str | None:
    """A command module's docstring cut to what `--help` shows: its first paragraph (what
    the command does) and the example command lines under it, indented by four."""
    if not docstring:
        return None
    paragraphs = docstring.strip("\n").split("\n\n")
    shown = [" ".join(paragraphs[0].split())]
    if len(paragraphs) > 1:
        lines = textwrap.dedent(paragraphs[1]).splitlines()
        continued = [False] + [line.rstrip().endswith("\\") for line in lines[:-1]]
        if all(line.startswith(COMMAND_START) or more for line, more in zip(lines, continued)):
            shown.append(textwrap.indent("\n".join(lines), "    "))
    return "\n\n".join(shown)


def asked(argv: list[str]) -> bool:
    """Whether the command line asks for this help (`--help` or `-h` anywhere in it)."""
    return any(a in HELP_FLAGS for a in argv)


def without_flags(argv: list[str]) -> list[str]:
    """The overrides beside `--help`: the help shows the defaults they make."""
    return [a for a in argv if a not in HELP_FLAGS and not a.startswith("-")]
