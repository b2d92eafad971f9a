"""The README and the manual stay true: every `mt-*` command they show composes into a
valid config (a renamed key fails here, not in a user's terminal), every link from
the README into the repository points at a file that exists, and every README or manual
section that a comment, docstring, config or page cites is there."""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
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

from helpers import compose_cfg, shared_cache

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
    if "--help" in args or "-h" in args:  # the help composes; a required key may stay unset
        compose_cfg(*overrides, config=name)
        return
    to_dataclass(schema, compose_cfg(*overrides, config=name))


# mt-* as the console scripts run them, from this tree: `python -m transformer.commands.<module>`
COMMAND_MODULES = {"mt-train": "train", "mt-translate": "translate", "mt-evaluate": "evaluate",
                   "mt-average": "average", "mt-export": "export"}


def section_commands(page: Path, title: str) -> list[str]:
    """The command lines of a section's first code block, continuation backslashes joined."""
    section = page.read_text().split(f"\n{title}\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return joined([line.rstrip() for line in block.splitlines()])


def test_the_readmes_own_corpus_commands_run_verbatim(tmp_path):
    """"Train on your own corpus": each line as the README gives it, in a folder holding the
    sample's files, one after the other: the run, a translation, the evaluations of its best
    checkpoint and of an average (each in its model's own folder), the export. The only
    addition is mt-train's data.cache_dir, the test session's shared cache."""
    lines = section_commands(PROJECT_ROOT / "README.md", "## Train on your own corpus")
    progs = [next(t for t in shlex.split(line, comments=True) if t.startswith("mt-")) for line in lines]
    assert progs == ["mt-train", "mt-translate", "mt-evaluate", "mt-average", "mt-evaluate", "mt-export"]
    shutil.copytree(PROJECT_ROOT / "data" / "sample", tmp_path / "data" / "sample")
    extra = {"mt-train": f' "data.cache_dir={shared_cache()}"'}
    shims = "\n".join(f'{prog}() {{ "{sys.executable}" -m transformer.commands.{module} "$@"{extra.get(prog, "")}; }}'
                      for prog, module in COMMAND_MODULES.items())
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    for line, prog in zip(lines, progs):
        if prog == "mt-export":
            pytest.importorskip("ctranslate2")
        proc = subprocess.run(["bash", "-c", f"set -eo pipefail\n{shims}\n{line}"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{line}\n{proc.stderr[-3000:]}"
        if prog == "mt-translate":
            assert proc.stdout.count("\n") == 1 and "its best checkpoint" in proc.stderr
    assert (tmp_path / "runs" / "mine" / "checkpoints" / "avg_last2" / "model.safetensors").is_file()
    for model in ("mine-best", "mine-avg_last2"):
        assert (tmp_path / "outputs" / "eval" / model / "dev.it.beam.json").is_file()
    assert (tmp_path / "exports" / "mine" / "export.json").is_file()


def test_the_readme_stays_a_front_door():
    """The README points into the manual; what grows goes to docs/ (it had reached 265 lines)."""
    lines = (PROJECT_ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 260, f"README.md has {len(lines)} lines: move detail into docs/"


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


# -- every README or manual section that a comment, docstring, config or page cites is there --

# `README "Training speed"`, `(README, "Training speed")`, `docs/performance.md "Decoding speed"`,
# `(docs/gpu.md, "Checking a GPU")`: a page, then a quoted heading (or its start) or a
# paragraph's bold lead (`**Speed and BLEU**`).
CITED_SECTION = re.compile(r'(?<![\w/.-])(README(?:\.md)?|(?:[\w-]+/)*[\w-]+\.md)(?:,\s*|\s+)"([^"\n]+)"')
# `docs/results/gpu.md#nvidia-h200-the-gpu-check`, `](gpu.md#checking-a-gpu-scriptsgpu_checksh)`: a heading's anchor
CITED_ANCHOR = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.md)#([\w-]+)")
CITING = sorted({*PAGES, *(PROJECT_ROOT / "transformer").rglob("*.py"), *(PROJECT_ROOT / "scripts").rglob("*.*"),
                 *(PROJECT_ROOT / "tests").rglob("*.py"), *CONFIG_DIR.rglob("*.yaml")}
                - {Path(__file__).resolve()})


def _plain(text: str) -> str:
    """Markdown's inline marks dropped (code, bold, links), whitespace collapsed."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return " ".join(text.replace("`", "").replace("**", "").split())


def sections(page: Path) -> tuple[list[str], set[str]]:
    """A page's headings and bold paragraph leads (plain text), and its headings' anchors
    (as MkDocs makes them); fenced code is left out."""
    from markdown.extensions.toc import slugify

    titles, anchors, fenced = [], set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:
            continue
        elif heading := re.match(r"#{1,6}\s+(.*)", line):
            titles.append(_plain(heading.group(1)))
            anchors.add(slugify(_plain(heading.group(1)), "-"))
        elif lead := re.match(r"\s*(?:[-*]\s+|\d+\.\s+)?\*\*(.+?)\*\*", line):
            titles.append(_plain(lead.group(1)))
    return titles, anchors


def cited_page(citing: Path, name: str) -> Path | None:
    """The page a citation names: README is the project's; a path is the citing page's
    neighbour (a link between pages of the manual) or the project's."""
    if name in ("README", "README.md"):
        return PROJECT_ROOT / "README.md"
    for base in (citing.parent, PROJECT_ROOT, PROJECT_ROOT / "docs"):
        if (base / name).is_file():
            return base / name
    return None


def broken_citations(citing: Path, text: str) -> list[str]:
    broken = []
    for name, section in CITED_SECTION.findall(text):
        page = cited_page(citing, name)
        if page is None or not any(_plain(section) in title for title in sections(page)[0]):
            broken.append(f'{name}, "{section}"')
    for name, anchor in CITED_ANCHOR.findall(text):
        page = cited_page(citing, name)
        if page is None or anchor not in sections(page)[1]:
            broken.append(f"{name}#{anchor}")
    return broken


def test_the_citation_check_tells_a_moved_section_from_a_live_one():
    here = PROJECT_ROOT / "transformer" / "device.py"
    assert broken_citations(here, '(README, "Training speed")') == ['README, "Training speed"']  # moved to docs/
    assert broken_citations(here, 'docs/performance.md "OMP_WAIT_POLICY" and (docs/masks.md, "Why add −∞ to '
                                  'the scores")') == []  # a bold lead; a heading's start
    assert broken_citations(here, "docs/gpu.md#checking-a-gpu-scriptsgpu_checksh") == []
    assert broken_citations(here, "docs/gpu.md#checking-a-gpu") == ["docs/gpu.md#checking-a-gpu"]
    assert broken_citations(here, 'docs/nowhere.md, "Layout"') == ['docs/nowhere.md, "Layout"']
    assert broken_citations(PROJECT_ROOT / "docs" / "precision.md", "](gpu.md#checking-a-gpu-scriptsgpu_checksh)") == []


def test_every_cited_readme_or_manual_section_exists():
    """A comment, docstring, config or page that cites `README "X"`, `docs/page.md, "X"`
    or `docs/page.md#x` points at a heading (or a bold paragraph lead) that is there: a
    section that moves or is renamed fails here, not in a reader's search."""
    found, broken = 0, []
    for path in CITING:
        text = path.read_text(encoding="utf-8")
        found += len(CITED_SECTION.findall(text)) + len(CITED_ANCHOR.findall(text))
        broken += [f"{path.relative_to(PROJECT_ROOT).as_posix()}: {b}" for b in broken_citations(path, text)]
    assert found > 30  # the patterns still see the project's citations (47 when written)
    assert broken == []


def layout_tree() -> dict[str, set[str]]:
    """docs/installation.md's tree of transformer/: each folder's modules as it names them
    ("" for the shared modules at the top, named with their `.py`)."""
    text = (PROJECT_ROOT / "docs" / "installation.md").read_text(encoding="utf-8")
    block = re.search(r"```text\ntransformer/\n(.*?)\ntests/", text, re.DOTALL).group(1)
    tree: dict[str, set[str]] = {}
    folder = ""
    for line in block.splitlines():
        names = re.split(r"\s{2,}layer \d", line)[0].lstrip("├└│─ ")
        if opened := re.match(r"(\w+)/\s+(.*)", names):
            folder, names = opened.groups()
        elif ".py" in names:
            folder = ""
        tree.setdefault(folder, set()).update(re.findall(r"\w+(?=\.py)" if not folder else r"\w+", names))
    return tree


def test_the_installation_pages_tree_names_every_module_and_no_other():
    """The tree in docs/installation.md, "Layout" is the package's: a module added, moved or
    renamed without the page fails here (it once lacked `translator.py`)."""
    package = PROJECT_ROOT / "transformer"
    real = {"": {p.stem for p in package.glob("*.py")} - {"__init__"}}
    for init in package.glob("*/__init__.py"):
        real[init.parent.name] = {p.stem for p in init.parent.glob("*.py")} - {"__init__"}
    assert layout_tree() == real


def test_ci_builds_the_manual_strictly_and_sees_its_warnings():
    """`mkdocs build --strict --quiet` passed with warnings: --quiet drops them before
    --strict counts them (#51). CI must run --strict without --quiet or -q."""
    builds = [shlex.split(line.split("#")[0]) for line in (PROJECT_ROOT / ".ci" / "run").read_text().splitlines()
              if "mkdocs build" in line.split("#")[0]]
    assert builds, ".ci/run no longer builds the manual"
    for args in builds:
        assert "--strict" in args and "--quiet" not in args and "-q" not in args, args


def test_no_issue_number_in_the_manual_the_readme_or_the_help():
    """The manual is for users: it names no issue of the project's tracker (`#57`, `issue
    #57`) in docs/, README.md or the settings' help texts that `--help` prints."""
    pattern = re.compile(r"(?<![\w/(-])#\d{2,}\b|\bissue #?\d+", re.IGNORECASE)
    texts = {p: p.read_text(encoding="utf-8") for p in [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").rglob("*.md"))]}
    texts[PROJECT_ROOT / "transformer/config.py"] = (PROJECT_ROOT / "transformer/config.py").read_text(encoding="utf-8")
    found = [f"{p.relative_to(PROJECT_ROOT)}:{n}: {line.strip()[:80]}" for p, text in texts.items()
             for n, line in enumerate(text.splitlines(), 1)
             for m in pattern.finditer(line) if not line[:m.start()].rstrip().endswith("](")]
    assert found == []


# What the extras add (pyproject.toml): none of it may be imported on the way to train,
# translate, evaluate, average or draw the masks.
OPTIONAL_MODULES = ("ctranslate2", "spacy", "argostranslate", "libretranslatepy", "optuna", "hydra_plugins",
                    "submitit", "sqlalchemy", "pytest", "ruff", "mkdocs", "mkdocstrings")
WITHOUT_EXTRAS = f"""
import runpy, sys
class NotInstalled:  # each finder of the interpreter, blind to the extras' modules
    def __init__(self, finder):
        self.finder = finder
    def __getattr__(self, name):  # find_distributions, invalidate_caches: the finder's own
        return getattr(self.finder, name)
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {OPTIONAL_MODULES!r}:
            return None
        return self.finder.find_spec(name, path, target)
sys.meta_path[:] = [NotInstalled(f) if hasattr(f, "find_spec") else f for f in sys.meta_path]
module, sys.argv = sys.argv[1], sys.argv[1:]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def test_the_base_install_trains_translates_and_evaluates_without_any_extra(tmp_path):
    """`pip install -e .` is enough for the first hour: with every extra's modules unimportable,
    mt-train, mt-translate, mt-evaluate, mt-average and mt-masks run on the sample; mt-export
    says in one line which extra it needs."""
    run = tmp_path / "run"
    steps = [
        ("train", ["debug=default", "data=sample", f"trainer.run_dir={run}", f"data.cache_dir={shared_cache()}"]),
        ("translate", [f"checkpoint={run}", "input.text=Ciao, come stai?"]),
        ("evaluate", [f"checkpoint={run}", "data=sample", "test_set=dev", "max_sentences=5",
                      f"output_dir={tmp_path / 'eval'}"]),
        ("average", [str(run), "--last", "2", "-o", str(tmp_path / "avg")]),
        ("masks", [f"checkpoint={run}", "sentences=[Ciao]", f"output={tmp_path / 'masks.png'}"]),
    ]
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "OMP_NUM_THREADS": "1"}
    for module, args in steps:
        proc = subprocess.run([sys.executable, "-c", WITHOUT_EXTRAS, f"transformer.commands.{module}", *args],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"mt-{module}: {proc.stderr[-3000:]}"
    export = subprocess.run([sys.executable, "-c", WITHOUT_EXTRAS, "transformer.commands.export",
                             f"checkpoint={run}", f"output={tmp_path / 'export'}"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert export.returncode == 1 and 'pip install -e ".[export]"' in export.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "export").exists()


DOCS_PAGES = sorted((PROJECT_ROOT / "docs").rglob("*.md"))
PAGE_LIMIT = 25_000  # bytes: a page a reader can take in; measurements go to docs/results/


def test_no_page_of_the_manual_is_above_25_kb():
    """A page per thing a user does, short enough to read: a page that grows past the
    limit is split by task, its measurements moved to a results page (images aside)."""
    offenders = [f"{p.relative_to(PROJECT_ROOT)}: {p.stat().st_size:,} bytes" for p in DOCS_PAGES
                 if p.stat().st_size > PAGE_LIMIT]
    assert not offenders, "pages above 25 KB: split them by task:\n" + "\n".join(offenders)


# How the work was done, not what the user gets: a past behaviour, the tracker's issue, the
# sessions that did the work, the figures of a traceback no user sees any more.
HISTORY = re.compile(r"\bit used to\b|\bthe issue(?:'s)?\b|\b(?:this|that|the next|the previous|no) session\b"
                     r"|\bsession's\b|\b\d+-line traceback\b|\bits old name\b|\btoday's\b", re.IGNORECASE)


def test_the_manual_and_the_readme_tell_no_history():
    pages = [PROJECT_ROOT / "README.md", *DOCS_PAGES]
    found = [f"{p.relative_to(PROJECT_ROOT)}:{n}: {line.strip()[:80]}" for p in pages
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if HISTORY.search(line)]
    assert not found, "history in the manual:\n" + "\n".join(found)


def test_the_history_check_tells_history_from_a_manual():
    assert HISTORY.search("`optim.label_smoothing=1.5` (it used to train)")
    assert HISTORY.search("the issue's targets") and HISTORY.search("a 62-line traceback")
    assert HISTORY.search("on the next session's machine") and HISTORY.search("today's recipe")
    assert not HISTORY.search("tests that need it build it once per session (tests/conftest.py)")
    assert not HISTORY.search("a traceback is for bugs; the issues of a corpus are named by line")


EXTRA = re.compile(r'\.\[([\w,-]+)\]')  # `pip install -e ".[export,docs]"`


def test_the_install_lines_and_every_extra_named_are_real():
    """README and the installation page give the CPU-only and the CUDA install, a line each;
    every `.[extra]` named in the manual, the configs, the scripts, the package's messages
    and CI exists in pyproject.toml."""
    import tomllib

    extras = set(tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    assert {"export", "serve", "docs", "dev"} <= extras
    for page in (PROJECT_ROOT / "README.md", PROJECT_ROOT / "docs" / "installation.md"):
        lines = code_lines(page)
        assert any(line.startswith("pip install torch --index-url https://download.pytorch.org/whl/cpu && pip install -e . ")
                   for line in lines), page
        assert any(line.startswith("pip install torch && pip install -e . ") for line in lines), page
    naming = [PROJECT_ROOT / "README.md", PROJECT_ROOT / ".ci" / "run", *DOCS_PAGES, *CONFIG_DIR.rglob("*.yaml"),
              *(PROJECT_ROOT / "transformer").rglob("*.py"), *(PROJECT_ROOT / "scripts").rglob("*.*")]
    unknown = [f"{p.relative_to(PROJECT_ROOT)}: .[{names}]" for p in naming if p.suffix != ".png"
               for names in EXTRA.findall(p.read_text(encoding="utf-8")) if not set(names.split(",")) <= extras]
    assert not unknown, "extras pyproject.toml does not have:\n" + "\n".join(unknown)


def test_the_configuration_reference_is_the_dataclasses():
    """docs/configuration.md is what scripts/config_reference.py writes from the dataclasses'
    docstrings: a setting added, renamed or described anew without the page fails here."""
    proc = subprocess.run([sys.executable, str(PROJECT_ROOT / "scripts" / "config_reference.py")],
                          env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    page = (PROJECT_ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert proc.stdout == page, "run: python scripts/config_reference.py > docs/configuration.md"
    for schema in (TranslateConfig, EvaluateConfig, PrepareConfig, ExportConfig, MasksConfig):  # mt-train: the groups
        assert f"({schema.__name__})" in page
    assert "| `trainer.max_hours` |" in page and "| `decode.beam_size` |" in page
