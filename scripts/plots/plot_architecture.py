"""The package's layers as a picture, drawn from its real import graph (docs/architecture.png).

    python scripts/plots/plot_architecture.py                      # writes docs/architecture.png
    python scripts/plots/plot_architecture.py --out /tmp/arch.png  # elsewhere

One box per subpackage (its modules listed inside) and per shared top-level module, in
rows by layer (scripts/plots/import_graph.py's LAYERS, lowest at the bottom); an arrow from a
box to another means a module of the first imports one of the second. Only the arrows
that no path of other arrows implies are drawn (the layers' spine); each box lists, in
small italics, everything it imports directly. The graph is read from the
code each time, so the picture cannot drift from it; rerun this after moving a module.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from import_graph import LAYERS, group, group_graph, read_graph

ROOT = Path(__file__).resolve().parents[2]
WIDTH, ROW, BOX_H = 18.0, 3.2, 2.0  # drawing units: the figure's width, one layer's height, a box's
COLOURS = ["#e8e8e8", "#d6eaf8", "#fdebd0", "#d5f5e3", "#fadbd8", "#e8daef"]  # by layer, lowest first


def boxes(root: Path) -> tuple[dict[str, list[str]], set[tuple[str, str]]]:
    """Each group (subpackage or shared module) with its modules' short names, and the
    imports between groups."""
    graph = read_graph(root)
    members: dict[str, list[str]] = defaultdict(list)
    for m in graph.modules:
        if m != group(m):
            members[group(m)].append(m.rsplit(".", 1)[1])
        else:
            members.setdefault(m, [])
    return dict(members), group_graph(graph).edges


def reduction(edges: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The imports no path of other imports implies (the graph has no cycle): the arrows.
    `commands` imports `model` directly too, but through `training` and the rest that is
    already drawn; each box lists every import it makes."""
    adj: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        adj[a].add(b)

    def reach(v: str, seen: set[str]) -> set[str]:
        for w in adj[v]:
            if w not in seen:
                seen.add(w)
                reach(w, seen)
        return seen

    return {(a, b) for a, b in edges if not any(b in reach(c, {c}) for c in adj[a] - {b})}


def place(members: dict[str, list[str]], arrows: set[tuple[str, str]]) -> dict[str, tuple[float, float, float]]:
    """(centre x, centre y, width) of each box: one row per layer, spread evenly; in a row,
    a box that others of the row import stands left of them, so that its arrows are short."""
    rows: dict[int, list[str]] = defaultdict(list)
    for g in members:
        rows[LAYERS[g]].append(g)
    where = {}
    for rank, names in rows.items():
        inside = {(a, b) for a, b in arrows if a in names and b in names}

        def depth(g: str, inside=inside) -> int:
            return max((1 + depth(b) for a, b in inside if a == g), default=0)

        alone = {g for g in names if not any(g in e for e in inside)}
        names.sort(key=lambda g, alone=alone: (g in alone, depth(g), g))
        step = WIDTH / len(names)
        width = min(step * 0.88, 5.4)
        for i, g in enumerate(names):
            where[g] = (step * (i + 0.5), rank * ROW, width)
    return where


def draw(members: dict[str, list[str]], edges: set[tuple[str, str]], out: Path) -> None:
    arrows = reduction(edges)
    where = place(members, arrows)
    top = max(LAYERS[g] for g in members)
    fig, ax = plt.subplots(figsize=(15, 1.75 * (top + 1) + 1.0), dpi=110)
    ax.set_xlim(-2.2, WIDTH + 0.2)
    ax.set_ylim(-BOX_H * 0.6, top * ROW + BOX_H * 0.6)
    ax.axis("off")

    for rank in range(top + 1):
        ax.text(-2.0, rank * ROW, f"layer {rank}", fontsize=12, fontweight="bold",
                va="center", ha="left", color="#555555")

    for a, b in sorted(arrows):
        xa, ya, wa = where[a]
        xb, yb, wb = where[b]
        style, skip = "arc3,rad=0.0", False
        if ya == yb:  # within a row: side to side, over the boxes between
            sign = 1 if xb > xa else -1
            start, end = (xa + sign * wa / 2, ya), (xb - sign * wb / 2, yb)
            if abs(xb - xa) > WIDTH / len([g for g in where if where[g][1] == ya]) * 1.5:
                start, end = (xa, ya + BOX_H / 2), (xb, yb + BOX_H / 2)
                style = f"arc3,rad={-0.3 * sign}"
        else:  # downwards: leave the bottom, toward the other box's side of the target
            start = (xa + (xb - xa) / WIDTH * wa * 0.8, ya - BOX_H / 2)
            end = (xb + (xa - xb) / WIDTH * wb * 0.8, yb + BOX_H / 2)
            if ya - yb > ROW * 1.5:  # past a layer between: bow out around its boxes
                start = (xa + wa / 2 * (1 if xb >= xa else -1), ya)
                style, skip = f"arc3,rad={-0.45 if xb >= xa else 0.45}", True
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=16,
                                     shrinkA=0, shrinkB=1, color="#2c3e50", linewidth=1.6,
                                     linestyle="--" if skip else "-", connectionstyle=style,
                                     zorder=4 if skip else 1))

    imports: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        imports[a].add(b)
    for g, (x, y, w) in where.items():
        ax.add_patch(FancyBboxPatch((x - w / 2, y - BOX_H / 2), w, BOX_H,
                                    boxstyle="round,pad=0.02,rounding_size=0.15",
                                    facecolor=COLOURS[LAYERS[g] % len(COLOURS)],
                                    edgecolor="#34495e", linewidth=1.2, zorder=2))
        mods = members[g]
        short = g.split(".", 1)[1]
        ax.text(x, y + BOX_H * 0.32, f"{short}/" if mods else f"{short}.py", ha="center",
                va="center", fontsize=13, fontweight="bold", zorder=3, family="monospace")
        chars = max(14, int(w * 7.4))
        if mods:
            ax.text(x, y + BOX_H * 0.02, "\n".join(textwrap.wrap(", ".join(sorted(mods)), chars)),
                    ha="center", va="center", fontsize=8.5, zorder=3, family="monospace")
        named = sorted(imports[g], key=lambda b: (-LAYERS[b], b))
        if named:
            line = "imports " + ", ".join(b.split(".", 1)[1] for b in named)
            ax.text(x, y - BOX_H * 0.36, "\n".join(textwrap.wrap(line, int(chars * 1.1))),
                    ha="center", va="center", fontsize=7.5, zorder=3, color="#7b241c", style="italic")

    ax.set_title("transformer/ by layer (scripts/plots/import_graph.py's LAYERS, lowest at the bottom). "
                 "An arrow is an import that no path of arrows implies\n(dashed: past a layer); "
                 "each box lists, in italics, every subpackage or shared module it imports.",
                 fontsize=11, loc="left")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to read")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "architecture.png")
    args = parser.parse_args(argv)
    members, edges = boxes(args.root)
    missing = sorted(g for g in members if g not in LAYERS)
    if missing:
        print("plot_architecture: in no layer (scripts/plots/import_graph.py LAYERS): " + ", ".join(missing),
              file=sys.stderr)
        return 1
    draw(members, edges, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
