"""The lineage graph as SVG: generations left to right, every node a link, the path to the best highlighted."""

from __future__ import annotations

from collections.abc import Callable
from html import escape

import networkx as nx

from evolve.browse.web.svg import color
from evolve.research.lineage import Lineage, oriented

COL, ROW, RADIUS = 46, 30, 10


def _layers(graph: nx.DiGraph) -> dict[str, int]:
    """Longest-path generation of each node within the graph (roots at 0)."""
    try:
        order = list(nx.topological_sort(graph))
    except nx.NetworkXUnfeasible:  # a cycle (should not happen): fall back to sequence order
        order = sorted(graph.nodes, key=lambda n: graph.nodes[n].get("seq") or 0)
    layer: dict[str, int] = {}
    for node in order:
        layer[node] = 1 + max(
            (layer[p] for p in graph.predecessors(node) if p in layer), default=-1
        )
    return layer


def lineage_svg(lineage: Lineage, focus: str, link: Callable[[str], str]) -> str:
    """Draw ``lineage`` (typically ``Lineage.around(focus)``) with ``focus`` ringed and the best path in red."""
    graph = lineage.graph
    path = lineage.path_to_best()
    on_path = set(path)
    path_edges = set(zip(path, path[1:], strict=False))
    layer = _layers(graph)
    columns: dict[int, list[str]] = {}
    for node, column in layer.items():
        columns.setdefault(column, []).append(node)
    row: dict[str, float] = {}
    for column in sorted(columns):

        def weight(node: str) -> tuple[int, float, int]:
            parents = [row[p] for p in graph.predecessors(node) if p in row]
            return (
                0 if node in on_path else 1,
                sum(parents) / len(parents) if parents else 0.0,
                graph.nodes[node].get("seq") or 0,
            )

        for index, node in enumerate(sorted(columns[column], key=weight)):
            row[node] = index
    scores = [
        oriented(f, lineage.direction) for _, f in graph.nodes(data="fitness") if f is not None
    ]
    low, high = (min(scores), max(scores)) if scores else (0.0, 1.0)
    width = (max(layer.values(), default=0) + 1) * COL + 40
    height = (max(row.values(), default=0) + 1) * ROW + 30

    def xy(node: str) -> tuple[float, float]:
        return 24 + layer[node] * COL, 20 + row[node] * ROW

    out = [
        f'<svg class="lineage" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'xmlns="http://www.w3.org/2000/svg">'
    ]
    for parent, child, data in graph.edges(data=True):
        (x1, y1), (x2, y2) = xy(parent), xy(child)
        mid = (x1 + x2) / 2
        kind = "best-path" if (parent, child) in path_edges else data.get("role", "mutation")
        out.append(f'<path class="edge {kind}" d="M{x1},{y1} C{mid},{y1} {mid},{y2} {x2},{y2}"/>')
    best = lineage.best()
    for node, data in graph.nodes(data=True):
        x, y = xy(node)
        fitness, status = data.get("fitness"), data.get("status", "")
        if fitness is not None:
            share = (
                (oriented(fitness, lineage.direction) - low) / (high - low) if high > low else 1.0
            )
            fill = color(share)
        else:
            fill = {"failed": "#e57373", "rejected": "#bdbdbd"}.get(status, "#ffffff")
        classes = (
            ["node"]
            + (["focus"] if node == focus else [])
            + (["best"] if node == best else [])
            + (["on-path"] if node in on_path else [])
        )
        tip = (
            f"{node[:12]} #{data.get('seq')} {data.get('operator', '')} {data.get('model') or 'builtin'} "
            f"{status} fitness {'-' if fitness is None else f'{fitness:.6g}'}"
        )
        letter = (data.get("operator") or "?")[0]
        out.append(
            f'<a href="{escape(link(node))}" class="{" ".join(classes)}" data-id="{node}">'
            f"<title>{escape(tip)}</title>"
            f'<circle cx="{x}" cy="{y}" r="{RADIUS}" fill="{fill}"/>'
            f'<text x="{x}" y="{y + 4}" text-anchor="middle">{escape(letter)}</text></a>'
        )
    out.append("</svg>")
    return "".join(out)
