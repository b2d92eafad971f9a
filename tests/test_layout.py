"""The package's layout as properties (issue #44): the layers of docs/architecture.md hold.

The graph is read from the code by scripts/plots/import_graph.py (an import inside a function
counts; one under `if TYPE_CHECKING:` does not), so these tests check what the modules
import, not what a page says they do. The rank of each subpackage and shared module is
its LAYERS table.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "transformer"
sys.path.insert(0, str(ROOT / "scripts" / "plots"))
import import_graph  # noqa: E402  (scripts/ is not a package)
from import_graph import (  # noqa: E402
    LAYERS,
    cycles,
    group,
    group_graph,
    layer_breaches,
    longest_chain,
    read_graph,
)

GRAPH = read_graph(ROOT)
SUBPACKAGES = sorted(p.parent.relative_to(ROOT).as_posix().replace("/", ".")
                     for p in PACKAGE.glob("*/__init__.py"))
FLAT_LONGEST_CHAIN = 11  # the flat package before the move (b005d97): train -> ... -> errors
MAX_CLASS_LINES = 200


def test_the_graph_is_read_from_the_whole_package():
    files = [p for p in PACKAGE.rglob("*.py") if p != PACKAGE / "__init__.py"]
    assert len(GRAPH.modules) == len(files) > 40
    assert len(GRAPH.edges) > 100
    # a function-level import is an edge: mt-export's command imports its converters lazily
    assert ("transformer.commands.export", "transformer.deploy.argos") in GRAPH.edges


def test_no_import_cycle_between_modules():
    assert cycles(GRAPH) == []


def test_no_import_cycle_between_subpackages():
    assert cycles(group_graph(GRAPH)) == []


def test_every_module_is_in_a_layer_and_no_module_imports_from_a_higher_one():
    assert layer_breaches(GRAPH) == []


def test_the_layers_name_every_subpackage_and_nothing_that_is_not_there():
    for name in LAYERS:
        path = ROOT.joinpath(*name.split("."))
        assert (path / "__init__.py").is_file() or path.with_suffix(".py").is_file(), name
    assert set(SUBPACKAGES) <= set(LAYERS)


def test_two_subpackages_of_one_layer_never_import_each_other():
    """Training, deployment and inspection (and the model and the data) stand side by side:
    each subpackage's docstring says it never imports its neighbours, and none does."""
    for a, b in group_graph(GRAPH).edges:
        if a in SUBPACKAGES and b in SUBPACKAGES:
            assert LAYERS[b] < LAYERS[a], f"{a} imports {b}, of the same layer"


def test_the_longest_import_chain_is_shorter_than_the_flat_packages():
    chain = longest_chain(GRAPH)
    assert len(chain) < FLAT_LONGEST_CHAIN, " -> ".join(chain)


def test_only_the_shared_modules_are_at_the_top_level():
    top = {m for m in GRAPH.modules if m.count(".") == 1 and m not in SUBPACKAGES}
    shared = {name for name in LAYERS if name not in SUBPACKAGES}
    assert top == shared
    assert len(top) == 8


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_every_subpackage_says_what_lives_there_and_what_it_may_import(package):
    """Its `__init__.py` docstring has a "May import:" paragraph, and every subpackage that
    paragraph allows is of the same or a lower layer (the docstring cannot promise more
    than the layers hold)."""
    init = ROOT.joinpath(*package.split(".")) / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
    assert doc.count("\n") >= 2, f"{init}: no docstring saying what lives there"
    rule = re.search(r"May import:(.*?)(?:\n\n|$)", doc, re.DOTALL)
    assert rule, f"{init}: its docstring names no 'May import:' rule"
    allowed = rule.group(1).split("never")[0]
    for named in re.findall(r"`(transformer\.\w+)`", allowed):
        assert named in LAYERS, f"{init} names {named}, which is in no layer"
        assert LAYERS[named] <= LAYERS[package], f"{init} allows {named}, of a higher layer"


def test_every_subpackage_imports_only_what_its_docstring_allows():
    """The subpackages a subpackage imports are named in its docstring's "May import:"
    paragraph (or it says "every other layer"): the docstring and the code agree."""
    imports = group_graph(GRAPH).out()
    for package in SUBPACKAGES:
        init = ROOT.joinpath(*package.split(".")) / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        allowed = re.search(r"May import:(.*?)(?:\n\n|$)", doc, re.DOTALL).group(1).split("never")[0]
        if "every other layer" in allowed:
            continue
        for other in sorted(imports[package] & set(SUBPACKAGES)):
            assert f"`{other}`" in allowed, f"{package} imports {other}; its docstring does not allow it"


def test_no_module_or_folder_takes_a_standard_library_name():
    """`python transformer/bounds.py` puts `transformer/` first on `sys.path`, so a module
    or folder there named like one of the standard library's hides it from everything
    imported after (a `transformer/inspect/` broke `typing_extensions`, which torch
    imports: `module 'inspect' has no attribute 'signature'`). Likewise in tests/ and
    scripts/, whose files are run by path."""
    taken = []
    for top in (PACKAGE, ROOT / "tests", ROOT / "scripts"):
        for folder in [top, *(p for p in top.rglob("*") if p.is_dir() and p.name != "__pycache__")]:
            names = {p.stem for p in folder.glob("*.py")}
            names |= {p.name for p in folder.iterdir() if p.is_dir() and p.name != "__pycache__"}
            taken += [f"{folder.relative_to(ROOT).as_posix()}/{n}" for n in sorted(names & sys.stdlib_module_names)]
    assert taken == []


def test_no_class_is_longer_than_200_lines():
    """A class is read in one sitting; what a long one does beside its job goes to small
    collaborators it calls. Fails for `Trainer` (training/trainer.py, 322 lines) until the
    branch that moves its state, signals and logging out (#44) is merged."""
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                long.append(f"{path.relative_to(ROOT).as_posix()}: class {node.name} is "
                            f"{node.end_lineno - node.lineno + 1} lines")
    assert long == []


def test_the_import_graph_script_exits_zero_on_this_tree():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "plots" / "import_graph.py")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "module cycles 0, subpackage cycles 0" in proc.stdout
    assert "layer breach" not in proc.stdout


def test_the_import_graph_script_finds_a_cycle_and_a_breach(tmp_path):
    """The script's exit status means something: a tree with a cycle and an import from a
    higher layer fails it."""
    pkg = tmp_path / "transformer"
    (pkg / "model").mkdir(parents=True)
    (pkg / "commands").mkdir()
    for init in (pkg, pkg / "model", pkg / "commands"):
        (init / "__init__.py").write_text('"""x"""\n')
    (pkg / "errors.py").write_text("from transformer import config\n")
    (pkg / "config.py").write_text("from transformer.errors import UserError\n")
    (pkg / "model" / "masks.py").write_text("from transformer.commands import train\n")
    (pkg / "commands" / "train.py").write_text("import transformer.model.masks\n")
    graph = read_graph(tmp_path)
    assert sorted(cycles(graph)) == [["transformer.commands.train", "transformer.model.masks"],
                                     ["transformer.config", "transformer.errors"]]
    assert any("transformer.model.masks (layer 1) imports transformer.commands.train" in b
               for b in layer_breaches(graph))
    assert import_graph.main(["--root", str(tmp_path)]) == 1


def test_group_is_the_subpackage_or_the_shared_module():
    assert group("transformer.model.transformer") == "transformer.model"
    assert group("transformer.errors") == "transformer.errors"


def test_the_architecture_picture_is_drawn_from_the_graph(tmp_path):
    """scripts/plots/plot_architecture.py draws docs/architecture.png from this graph: it runs,
    and the picture the manual shows is there."""
    out = tmp_path / "architecture.png"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "plots" / "plot_architecture.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (ROOT / "docs" / "architecture.png").is_file()


def test_the_architecture_pages_figures_are_the_graphs():
    """docs/architecture.md's printout of scripts/plots/import_graph.py (modules, imports, the
    longest chain) is what the code has: a module added or an import cut without the page fails here."""
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    counts = re.search(r"^modules (\d+), imports (\d+), module cycles 0", page, re.M)
    chain = re.search(r"^longest chain: (\d+) modules", page, re.M)
    assert counts and chain, "docs/architecture.md lost import_graph.py's printout"
    assert int(counts[1]) == len(GRAPH.modules)
    assert int(counts[2]) == len(GRAPH.edges)
    assert int(chain[1]) == len(longest_chain(GRAPH))


def test_the_dataflow_picture_names_only_modules_that_are_there(tmp_path):
    """scripts/plots/plot_dataflow.py draws docs/dataflow.png, a sentence pair's way through the
    modules; a step naming a module that moved stops it in one line."""
    sys.path.insert(0, str(ROOT / "scripts" / "plots"))
    import plot_dataflow

    plot_dataflow.check_modules(ROOT)  # every step's module is in the package and a layer
    out = tmp_path / "dataflow.png"
    assert plot_dataflow.main(["--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    moved = dict(plot_dataflow.STEPS, read=("read", "transformer.corpus", 1, 0))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plot_dataflow, "STEPS", moved)
        with pytest.raises(SystemExit, match=r"transformer\.corpus"):
            plot_dataflow.check_modules(ROOT)


# -- every path and dotted name the docs mention follows the tree ------------------------

PAGES = [ROOT / "README.md", ROOT / "data" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
REPO_PATH = re.compile(r"(?<![\w/.-])((?:transformer|tests|scripts)/[\w/.-]*\.(?:py|sh))")
# a dotted name, not transformer.py; one followed by an arrow is an old name that moved
DOTTED = re.compile(r"(?<![\w/.-])(transformer(?:\.(?!py\b)[A-Za-z_]\w*)+)(?!\.?\w)(?!`?\s*→)")
# a file named alone, `corpus.py`; one followed by an arrow is an old name that moved
BARE_FILE = re.compile(r"`(\w+\.py)`(?!\s*→)")
FILE_NAMES = {p.name for folder in ("transformer", "tests", "scripts") for p in (ROOT / folder).rglob("*.py")}


def _docstrings(path: Path) -> str:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return "\n".join(ast.get_docstring(n) or "" for n in ast.walk(tree) if isinstance(n, kinds))


def _top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def resolves(dotted: str) -> bool:
    """`transformer.decoding.text` (a module), or `transformer.decoding.text.translate_nbest`
    (a module and a name defined at its top level, a class's attribute after it)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:i])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if module.is_file():
            return i == len(parts) or parts[i] in _top_level_names(module)
    return False


def test_the_docs_check_tells_a_stale_name_from_a_live_one():
    assert resolves("transformer.decoding.text.translate_nbest")
    assert resolves("transformer.model")
    assert not resolves("transformer.decoding.translate_nbest")  # the flat package's decoding.py
    assert not resolves("transformer.trainer")
    assert DOTTED.findall("`transformer.py`, `transformer.data.corpus`") == ["transformer.data.corpus"]
    assert DOTTED.findall("`transformer.train` → `transformer.commands.train`") == ["transformer.commands.train"]
    assert BARE_FILE.findall("`cleaned.py` → `data/clean_split.py`, see `corpus.py`") == ["corpus.py"]


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_every_path_and_module_a_page_names_exists(page):
    """A `transformer/...py`, `tests/...py` or `scripts/...` path, a dotted
    `transformer.x.y` name, and a file named alone (`clean_split.py`) in a page are there
    in the tree, so a move that forgets a page fails here."""
    text = page.read_text(encoding="utf-8")
    missing = [p for p in REPO_PATH.findall(text) if not (ROOT / p).exists()]
    missing += [d for d in DOTTED.findall(text) if not resolves(d)]
    missing += [f for f in BARE_FILE.findall(text) if f not in FILE_NAMES]
    assert missing == []


def test_every_path_and_module_a_docstring_names_exists():
    """The same for the package's docstrings, which the API reference renders."""
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = _docstrings(path)
        missing += [f"{path.relative_to(ROOT)}: {p}" for p in REPO_PATH.findall(text) if not (ROOT / p).exists()]
        missing += [f"{path.relative_to(ROOT)}: {d}" for d in DOTTED.findall(text) if not resolves(d)]
    assert missing == []
