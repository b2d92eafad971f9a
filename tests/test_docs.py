"""The README and the manual stay true: every `mt-*` command they show composes into a
valid config (a renamed key fails here, not in a user's terminal), and every link from
the README into the repository points at a file that exists."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

from transformer.commands.average import parse_args
from transformer.commands.evaluate import EvaluateConfig
from transformer.commands.masks import MasksConfig
from transformer.commands.overrides import rewrite
from transformer.commands.prepare import PrepareConfig
from transformer.commands.translate import TranslateConfig
from transformer.config import TrainConfig, to_dataclass
from transformer.deploy.ct2_export import ExportConfig
from transformer.paths import CONFIG_DIR, PROJECT_ROOT

from helpers import compose_cfg

PAGES = [PROJECT_ROOT / "README.md", PROJECT_ROOT / "data" / "README.md",
         *sorted((PROJECT_ROOT / "docs").rglob("*.md"))]
# command -> (Hydra config name, the dataclass it must fill)
HYDRA_COMMANDS = {
    "mt-train": ("train", TrainConfig), "transformer.commands.train": ("train", TrainConfig),
    "mt-translate": ("translate", TranslateConfig), "mt-evaluate": ("evaluate", EvaluateConfig),
    "mt-prepare": ("prepare", PrepareConfig), "mt-export": ("export", ExportConfig),
    "mt-masks": ("masks", MasksConfig),
}


def code_lines(page: Path) -> list[str]:
    """The lines of a page's fenced code blocks, continuation backslashes joined."""
    inside, fenced = [], False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:
            inside.append(line.rstrip())
    return joined(inside)


def example_lines(path: Path) -> list[str]:
    """The lines of a config's comments or a module's docstring, continuation backslashes
    joined: where configs/*.yaml and transformer/**/*.py show their commands."""
    if path.suffix == ".yaml":
        text = [line.strip()[1:] for line in path.read_text().splitlines() if line.strip().startswith("#")]
    else:
        text = (ast.get_docstring(ast.parse(path.read_text())) or "").splitlines()
    return joined([line.strip() for line in text])


def joined(lines: list[str]) -> list[str]:
    """Lines with each one ending in a backslash joined to the next."""
    out, pending = [], ""
    for line in lines:
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        out.append(pending)
        pending = ""
    return out


def commands(page: Path) -> list[tuple[str, list[str]]]:
    """(program, arguments) of each mt-* command (or `-m transformer.commands.train`) in the page's
    code blocks, or in a config's comments or a module's docstring; a pipeline's or list's
    other parts are left out."""
    found = []
    lines = code_lines(page) if page.suffix == ".md" else example_lines(page)
    for line in lines:
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:
            continue
        part: list[str] = []
        for token in [*tokens, "|"]:
            if token not in ("|", "&&", ";", "||"):
                part.append(token)
                continue
            prog = next((t for t in part[:4] if t in HYDRA_COMMANDS or t == "mt-average"), None)
            if part and part[0] in ("mt-train", "mt-translate", "mt-evaluate", "mt-prepare", "mt-export",
                                    "mt-masks", "mt-average"):
                prog = part[0]
            if prog is not None:
                args = part[part.index(prog) + 1 :]
                found.append((prog, [a for a in args if a not in (">", "<")]))
            part = []
    return found


def _first_of_sweep(override: str) -> str:
    """`optim.lr=1e-3,5e-3` or `optim.lr=choice(1e-3, 5e-3)` in a multirun: the first value
    (what one job composes)."""
    key, _, value = override.partition("=")
    if value.startswith("choice(") and value.endswith(")"):
        value = value[len("choice("):-1]
    if "," in value and not value.startswith(("[", "{", "'", '"')):
        value = value.split(",")[0].strip()
    return f"{key}={value}"


ALL = [(page, prog, args) for page in PAGES for prog, args in commands(page)]
# The examples in the configs' comments and the modules' docstrings (mt-evaluate's
# `test_set=src.it,ref.en`, mt-average's `-o`): they run verbatim too.
SOURCES = [*sorted(CONFIG_DIR.rglob("*.yaml")), *sorted((PROJECT_ROOT / "transformer").rglob("*.py"))]
EXAMPLES = [(src, prog, args) for src in SOURCES for prog, args in commands(src)]


def test_the_pages_show_commands_of_every_kind():
    progs = {prog for _, prog, _ in ALL}
    assert {"mt-train", "mt-translate", "mt-evaluate", "mt-prepare", "mt-export", "mt-masks",
            "mt-average"} <= progs
    assert len(ALL) > 40


def test_the_configs_and_docstrings_show_commands_of_every_kind():
    progs = {prog for _, prog, _ in EXAMPLES}
    assert {"mt-train", "mt-translate", "mt-evaluate", "mt-prepare", "mt-export", "mt-masks",
            "mt-average"} <= progs
    assert len(EXAMPLES) > 30


@pytest.mark.parametrize(("page", "prog", "args"), ALL + EXAMPLES,
                         ids=[f"{p.name}:{prog}:{' '.join(a)[:60]}" for p, prog, a in ALL + EXAMPLES])
def test_every_documented_command_composes(page, prog, args):
    """As the command would compose it: the overrides rewritten as `cli.hydra_entry` does."""
    if prog == "mt-average":
        parse_args([a for a in args if a])
        return
    name, schema = HYDRA_COMMANDS[prog]
    if any(a.startswith("hparams_search=") for a in args):  # an Optuna study: the tune extra
        pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    if any("submitit" in a for a in args):
        pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    multirun = "-m" in args or "--multirun" in args
    overrides = [a for a in args if "=" in a and not a.startswith("-")]
    if multirun:
        overrides = [_first_of_sweep(o) for o in overrides]
    overrides = rewrite(overrides, schema)
    to_dataclass(schema, compose_cfg(*overrides, config=name))


def test_the_readmes_links_into_the_repository_exist():
    text = (PROJECT_ROOT / "README.md").read_text()
    links = [t for t in re.findall(r"\]\(([^)#\s]+)", text) if not t.startswith("http")]
    assert len(links) >= 10
    for target in links:
        assert (PROJECT_ROOT / target).exists(), target


def test_every_page_is_in_the_sites_navigation():
    nav = (PROJECT_ROOT / "mkdocs.yml").read_text()
    for page in (PROJECT_ROOT / "docs").rglob("*.md"):
        assert page.relative_to(PROJECT_ROOT / "docs").as_posix() in nav, page


def test_ci_builds_the_manual_strictly_and_sees_its_warnings():
    """`mkdocs build --strict --quiet` passed with warnings: --quiet drops them before
    --strict counts them (#51). CI must run --strict without --quiet or -q."""
    builds = [shlex.split(line.split("#")[0]) for line in (PROJECT_ROOT / ".ci" / "run").read_text().splitlines()
              if "mkdocs build" in line.split("#")[0]]
    assert builds, ".ci/run no longer builds the manual"
    for args in builds:
        assert "--strict" in args and "--quiet" not in args and "-q" not in args, args
