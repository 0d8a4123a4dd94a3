"""The lineage graph: a networkx DiGraph built from the archive's ``edges`` table.

Edges point from parent to child and carry their ``role`` (mutation, crossover,
migration, inspiration); nodes carry the candidate's seq, operator, model, status,
island and latest fitness. A candidate's *primary* parent is its first non-inspiration
parent (the one its operator edited); following primary parents from the best candidate
back to the seed gives the path to the best. (Success per operator and model:
``plots.success_rates``.)

Reads only, through the read model (``evolve.query``): every function takes an open
``sqlite3.Connection`` or a ``Store``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolve import query
from evolve.query import Source
from evolve.query.candidates import brief
from evolve.query.edges import (
    PARENT_ROLES,
    edge_between,
    edges,
    edges_from,
    edges_into,
    elite_ids,
    nodes,
    parent_ids,
    primary_path,
)
from evolve.query.run import best_candidate, objective_direction

if TYPE_CHECKING:
    import networkx as nx


def oriented(value: float, direction: str) -> float:
    """``value`` mapped so that larger is better."""
    return value if direction == "max" else -value


def _add_nodes(graph: nx.DiGraph, source: Source, ids: list[str] | None) -> None:
    elites = elite_ids(source)
    graph.add_nodes_from(
        (
            cid,
            {
                "seq": seq,
                "operator": op,
                "model": model or "",
                "status": status,
                "island": island,
                "fitness": fitness,
                "elite": cid in elites,
            },
        )
        for cid, seq, op, model, status, island, fitness in nodes(source, ids)
    )


class Lineage:
    """A lineage graph with the questions one asks of it.

    Build one with ``Lineage.load`` (the whole archive) or ``Lineage.around`` (the
    neighbourhood of one candidate, cheap on any archive size).

    Args:
        graph: a DiGraph with parent -> child edges as described in the module docstring.
        direction: "max" or "min", the objective's direction.
    """

    def __init__(self, graph: nx.DiGraph, *, direction: str = "max") -> None:
        self.graph = graph
        self.direction = direction
        self._best: str | None = None

    @classmethod
    def load(cls, source: Source, *, roles: Iterable[str] = PARENT_ROLES) -> Lineage:
        """The whole archive's lineage over edges of the given roles."""
        conn = query.connection(source)
        import networkx as nx  # imported when a graph is built

        graph = nx.DiGraph()
        _add_nodes(graph, conn, None)
        graph.add_edges_from(
            (p, c, {"role": r, "order": o}) for p, c, r, o in edges(conn, tuple(roles))
        )
        return cls(graph, direction=objective_direction(conn))

    @classmethod
    def around(
        cls,
        source: Source,
        candidate_id: str,
        *,
        roles: Iterable[str] = PARENT_ROLES,
        max_ancestors: int = 200,
        max_children: int = 40,
        with_best_path: bool = True,
    ) -> Lineage:
        """The neighbourhood of one candidate: its ancestors (nearest first, at most
        ``max_ancestors``), its children, and the path from the seed to the best.
        """
        conn = query.connection(source)
        roles = tuple(roles)
        nodes_seen: dict[str, None] = {candidate_id: None}
        found: list[tuple[str, str, str, int]] = []
        frontier = [candidate_id]
        while frontier and len(nodes_seen) < max_ancestors + 1:
            rows = edges_into(conn, frontier, roles)
            frontier = []
            for row in rows:
                if len(nodes_seen) > max_ancestors and row[0] not in nodes_seen:
                    continue
                found.append(row)
                if row[0] not in nodes_seen:
                    nodes_seen[row[0]] = None
                    frontier.append(row[0])
        children = edges_from(conn, candidate_id, roles, limit=max_children)
        found += children
        nodes_seen.update((row[1], None) for row in children)
        best = best_candidate(conn) if with_best_path else None
        if best is not None:
            path = primary_path(conn, best)
            nodes_seen.update((cid, None) for cid in path)
            found += [
                (parent, child, "path", -1) for parent, child in zip(path, path[1:], strict=False)
            ]
        import networkx as nx  # imported when a graph is built

        graph = nx.DiGraph()
        _add_nodes(graph, conn, list(nodes_seen))
        for parent, child, role, order in found:
            if role == "path" and graph.has_edge(parent, child):
                continue
            if role == "path":  # the real role of a path edge, looked up only when not seen already
                role, order = edge_between(conn, parent, child) or ("mutation", -1)
            graph.add_edge(parent, child, role=role, order=order)
        lineage = cls(graph, direction=objective_direction(conn))
        lineage._best = best
        return lineage

    # --- questions ------------------------------------------------------------------------------

    def ancestors(self, candidate_id: str) -> set[str]:
        """Every candidate ``candidate_id`` descends from."""
        import networkx as nx

        return set(nx.ancestors(self.graph, candidate_id))

    def descendants(self, candidate_id: str) -> set[str]:
        """Every candidate that descends from ``candidate_id``."""
        import networkx as nx

        return set(nx.descendants(self.graph, candidate_id))

    def parents(self, candidate_id: str) -> list[str]:
        """Parents in the order the operator listed them (the primary one first)."""
        preds = self.graph.in_edges(candidate_id, data="order")
        return [parent for parent, _, _ in sorted(preds, key=lambda edge: edge[2])]

    def best(self) -> str | None:
        """The best evaluated candidate in the graph."""
        if self._best is not None:
            return self._best
        scored = [
            (oriented(f, self.direction), -d["seq"], n)
            for n, d in self.graph.nodes(data=True)
            if (f := d.get("fitness")) is not None
        ]
        return max(scored)[2] if scored else None

    def path_to(self, candidate_id: str) -> list[str]:
        """Primary parents from the oldest ancestor in the graph down to ``candidate_id``."""
        path, seen = [candidate_id], {candidate_id}
        while True:
            parents = [p for p in self.parents(path[-1]) if p not in seen]
            if not parents:
                return path[::-1]
            path.append(parents[0])
            seen.add(parents[0])

    def path_to_best(self) -> list[str]:
        """The path from the seed to the best candidate (empty without one)."""
        best = self.best()
        return self.path_to(best) if best is not None else []

    # --- export ---------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """Node-link JSON (networkx's format) with ``best`` and ``path_to_best`` added."""
        import networkx as nx

        data = nx.node_link_data(self.graph, edges="edges")
        data["best"] = self.best()
        data["path_to_best"] = self.path_to_best()
        return data

    def to_dot(self) -> str:
        """Graphviz DOT text; the path to the best is drawn bold red."""
        path = self.path_to_best()
        on_path = set(zip(path, path[1:], strict=False))
        lines = [
            "digraph lineage {",
            "  rankdir=LR;",
            '  node [shape=box, fontname="monospace", fontsize=10];',
        ]
        for node, data in self.graph.nodes(data=True):
            fitness = data.get("fitness")
            score = "-" if fitness is None else f"{fitness:.6g}"
            label = f"{node[:8]}\\n{data.get('operator', '?')} {score}"
            style = ', style=filled, fillcolor="#ffe0b2"' if node in path else ""
            if data.get("status") in ("failed", "rejected"):
                style += ', color="#9e9e9e", fontcolor="#757575"'
            lines.append(f'  "{node}" [label="{label}"{style}];')
        for parent, child, data in self.graph.edges(data=True):
            attrs = [f'label="{data.get("role", "")}"']
            if (parent, child) in on_path:
                attrs += ['color="#d32f2f"', "penwidth=2.5"]
            elif data.get("role") == "inspiration":
                attrs.append("style=dotted")
            lines.append(f'  "{parent}" -> "{child}" [{", ".join(attrs)}];')
        lines.append("}")
        return "\n".join(lines) + "\n"

    def write_graphml(self, path: Path | str) -> Path:
        """Write GraphML (missing fitness values are left out, as GraphML has no null)."""
        graph = self.graph.copy()
        for _, data in graph.nodes(data=True):
            if data.get("fitness") is None:
                data.pop("fitness", None)
        import networkx as nx

        nx.write_graphml(graph, str(path))
        return Path(path)


def ancestry(source: Source, candidate_id: str, *, depth: int = 30) -> dict[str, Any]:
    """The chain of primary parents leading to a candidate, oldest first (at most ``depth`` steps shown).

    Each row has the generation (0 = the oldest ancestor), operator, model, status,
    fitness, the change from the previous row and the candidate's other parents.
    """
    conn = query.connection(source)
    path = primary_path(conn, candidate_id)
    start = max(0, len(path) - depth)
    direction = objective_direction(conn)
    rows, previous = [], None
    for generation, cid in enumerate(path[start:], start):
        operator, model, status, fitness = brief(conn, cid)
        delta = None
        if fitness is not None and previous is not None:
            delta = fitness - previous if direction == "max" else previous - fitness
        others = [
            p for p in parent_ids(conn, cid) if p != (path[generation - 1] if generation else None)
        ]
        rows.append(
            {
                "generation": generation,
                "id": cid,
                "operator": operator,
                "model": model,
                "status": status,
                "fitness": fitness,
                "delta": delta,
                "other_parents": others,
            }
        )
        previous = fitness if fitness is not None else previous
    return {
        "id": candidate_id,
        "generations": len(path),
        "shown_from": start,
        "direction": direction,
        "path": rows,
    }
