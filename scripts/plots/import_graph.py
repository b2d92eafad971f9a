"""The package's import graph, read from its own code: modules, imports, cycles, layers.

    python scripts/plots/import_graph.py                 # the figures, and any cycle or layer breach
    python scripts/plots/import_graph.py --dot graph.dot # the subpackage graph for Graphviz
    python scripts/plots/import_graph.py --root /other/checkout   # another tree (a commit before the move)

An import is an edge wherever it stands in a module (a function-level import counts: it
ties the two modules as surely as one at the top), except under `if TYPE_CHECKING:`,
which never runs. `from transformer import x` is an edge
to the module `transformer.x` when there is one, and `from transformer.pkg import name` an
edge to `transformer.pkg.name` when that is a module, else to the package's `__init__`.
The package's own `__init__` (the face, `from transformer import Translator`) is left out:
it hands names on lazily and no module of the package imports it.

The layers (docs/architecture.md): every module belongs to one, by its folder, and imports
only from its own layer or one below. tests/test_layout.py holds the package to them.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "transformer"

# Lowest first. A subpackage's modules and the top-level modules named here share the
# layer's rank; a module may import from any layer of lower or equal rank.
LAYERS: dict[str, int] = {
    # the few modules every layer uses: errors, bounds, paths, settings, device, the output
    # rule and its atomic writers
    "transformer.errors": 0, "transformer.bounds": 0, "transformer.paths": 0,
    "transformer.config": 0, "transformer.device": 0, "transformer.outputs": 0,
    "transformer.atomic_files": 0,
    "transformer.model": 1,       # the network: masks, attention, layers, the Transformer
    "transformer.data": 1,        # corpora to batches: reading, cleaning, encoding, tokenizer
    "transformer.metrics": 1,     # scoring translations: the name-copy rate beside sacrebleu's
    "transformer.checkpoint": 2,  # a model and its tokenizer on disk
    "transformer.decoding": 3,    # search, text in and text out, a CTranslate2 model, Translator
    "transformer.training": 4,    # the loop, validation, loss, optimizer, run directory, sweeps
    "transformer.deploy": 4,      # CTranslate2 conversion, Argos packages, fair serving
    "transformer.inspection": 4,  # masks and attention as pictures, learning curves
    "transformer.commands": 5,    # the mt-* entry points
}


@dataclass
class Graph:
    modules: list[str]
    edges: set[tuple[str, str]] = field(default_factory=set)

    def out(self) -> dict[str, set[str]]:
        adj: dict[str, set[str]] = defaultdict(set)
        for a, b in self.edges:
            adj[a].add(b)
        return adj


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def read_graph(root: Path) -> Graph:
    """Every module of `root`/transformer and the imports between them."""
    files = sorted((root / PACKAGE).rglob("*.py"))
    names = {module_name(f, root): f for f in files}
    graph = Graph(modules=sorted(n for n in names if n != PACKAGE))
    for name, f in names.items():
        if name == PACKAGE:
            continue
        is_pkg = f.name == "__init__.py"
        tree = ast.parse(f.read_text(encoding="utf-8"), str(f))
        typing_only = {id(n) for block in ast.walk(tree) if _is_type_checking(block)
                       for stmt in block.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's own package
                    pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (node.level - 1)]
                    base = ".".join(pkg + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in names else base for a in node.names]
            for t in targets:
                while t and t not in names:  # `import transformer.a.b` ties to the nearest module
                    t = t.rpartition(".")[0]
                if t and t != PACKAGE and t != name:
                    graph.edges.add((name, t))
    return graph


def _is_type_checking(node: ast.AST) -> bool:
    """`if TYPE_CHECKING:`: imports for annotations only, never run."""
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def cycles(graph: Graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    adj, index, low, stack, on, out = graph.out(), {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in adj[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in graph.modules:
        if v not in index:
            visit(v)
    return out


def longest_chain(graph: Graph) -> list[str]:
    """The longest path of modules importing each other (an import inside a cycle is left out)."""
    inside = {m: i for i, c in enumerate(cycles(graph)) for m in c}
    adj, memo = defaultdict(set), {}
    for a, b in graph.edges:
        if not (a in inside and inside[a] == inside.get(b)):
            adj[a].add(b)

    def chain(v: str) -> list[str]:
        if v not in memo:
            memo[v] = [v, *max((chain(w) for w in adj[v]), key=len, default=[])]
        return memo[v]

    return max((chain(v) for v in graph.modules), key=len, default=[])


def group(module: str) -> str:
    """A module's subpackage (`transformer.model.transformer`), or the module itself when at the top."""
    parts = module.split(".")
    return ".".join(parts[:2])


def group_graph(graph: Graph) -> Graph:
    groups = Graph(modules=sorted({group(m) for m in graph.modules}))
    groups.edges = {(group(a), group(b)) for a, b in graph.edges if group(a) != group(b)}
    return groups


def layer_breaches(graph: Graph) -> list[str]:
    """Imports from a higher layer, and modules in no layer."""
    found = [f"{m} is in no layer (scripts/plots/import_graph.py LAYERS)" for m in graph.modules
             if group(m) not in LAYERS]
    for a, b in sorted(graph.edges):
        ga, gb = group(a), group(b)
        if ga in LAYERS and gb in LAYERS and LAYERS[gb] > LAYERS[ga]:
            found.append(f"{a} (layer {LAYERS[ga]}) imports {b} (layer {LAYERS[gb]})")
    return found


def summary(graph: Graph) -> dict:
    groups = group_graph(graph)
    loops = cycles(graph)
    return {
        "modules": len(graph.modules),
        "imports": len(graph.edges),
        "module cycles": loops,
        "subpackage cycles": cycles(groups),
        "longest chain": longest_chain(graph),
    }


_PACKAGES: set[str] = set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2],
                        help="the checkout to read (default: this one)")
    parser.add_argument("--dot", type=Path, help="write the subpackage graph here (Graphviz)")
    args = parser.parse_args(argv)
    if not (args.root / PACKAGE / "__init__.py").is_file():
        print(f"import_graph: {args.root} holds no {PACKAGE}/__init__.py", file=sys.stderr)
        return 1
    _PACKAGES.update(module_name(p, args.root) for p in (args.root / PACKAGE).rglob("__init__.py"))
    graph = read_graph(args.root)
    s = summary(graph)
    print(f"modules {s['modules']}, imports {s['imports']}, "
          f"module cycles {len(s['module cycles'])}, subpackage cycles {len(s['subpackage cycles'])}")
    for c in s["module cycles"] + (s["subpackage cycles"] if len(_PACKAGES) > 1 else []):
        print("  cycle: " + " <-> ".join(c))
    if s["longest chain"]:
        print(f"longest chain: {len(s['longest chain'])} modules: " + " -> ".join(s["longest chain"]))
    top = [m for m in graph.modules if m.count(".") == 1 and m not in _PACKAGES]
    print(f"top-level modules {len(top)}: " + ", ".join(m.split(".")[1] for m in top))
    breaches = layer_breaches(graph) if len(_PACKAGES) > 1 else []
    for b in breaches:
        print("  layer breach: " + b)
    if args.dot:
        groups = group_graph(graph)
        lines = ["digraph layers {", "  rankdir=BT; node [shape=box];"]
        lines += [f'  "{a}" -> "{b}";' for a, b in sorted(groups.edges)]
        args.dot.write_text("\n".join([*lines, "}"]) + "\n")
    return 1 if s["module cycles"] or breaches else 0


if __name__ == "__main__":
    sys.exit(main())
