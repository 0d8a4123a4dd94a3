"""The lineage graph: a networkx DiGraph built from the archive's ``edges`` table.

Edges point from parent to child and carry their ``role`` (mutation, crossover,
migration, inspiration); nodes carry the candidate's seq, operator, model, status,
island and latest fitness. A candidate's *primary* parent is its first non-inspiration
parent (the one its operator edited); following primary parents from the best candidate
back to the seed gives the path to the best. (Success per operator and model:
``plots.success_rates``.)

Reads only: every function takes an open ``sqlite3.Connection`` or a ``Store``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolve.store import Store

if TYPE_CHECKING:
    import networkx as nx

PARENT_ROLES: tuple[str, ...] = ("mutation", "crossover", "migration")
ALL_ROLES: tuple[str, ...] = (*PARENT_ROLES, "inspiration")

_NODE_SQL = (
    "SELECT c.id, c.seq, c.operator, c.model, c.status, c.island, "
    "(SELECT v.fitness FROM evaluations v WHERE v.candidate = c.id ORDER BY v.id DESC LIMIT 1) "
    "FROM candidates c"
)


def _conn(source: sqlite3.Connection | Store) -> sqlite3.Connection:
    return source.conn if isinstance(source, Store) else source


def _marks(values: Iterable[Any]) -> str:
    return ",".join("?" for _ in values)


def objective_direction(source: sqlite3.Connection | Store) -> str:
    """Whether the run maximises ("max") or minimises ("min") its objective.

    Read from the ``objective`` state key when the run recorded it; otherwise inferred
    from the stats time series (the best value only ever moves in the good direction);
    "max" when nothing tells.
    """
    conn = _conn(source)
    row = conn.execute("SELECT value FROM state WHERE key='objective'").fetchone()
    if row:
        value = json.loads(row[0])
        direction = str(value.get("direction", "max") if isinstance(value, dict) else value).lower()
        return "min" if direction.startswith("min") else "max"
    first_last = conn.execute(
        "SELECT (SELECT best FROM stats WHERE best IS NOT NULL ORDER BY id LIMIT 1), "
        "(SELECT best FROM stats WHERE best IS NOT NULL ORDER BY id DESC LIMIT 1)"
    ).fetchone()
    if first_last and None not in first_last and first_last[1] < first_last[0]:
        return "min"
    return "max"


def oriented(value: float, direction: str) -> float:
    """``value`` mapped so that larger is better."""
    return value if direction == "max" else -value


def best_candidate(source: sqlite3.Connection | Store) -> str | None:
    """The id of the best elite over all islands (None for an archive without elites)."""
    conn = _conn(source)
    order = "DESC" if objective_direction(conn) == "max" else "ASC"
    row = conn.execute(
        f"SELECT candidate FROM elites ORDER BY objective {order}, island, cell LIMIT 1"
    ).fetchone()
    return row[0] if row else None


def primary_parent(source: sqlite3.Connection | Store, candidate_id: str) -> str | None:
    """The parent the candidate's operator edited (its first non-inspiration parent)."""
    row = (
        _conn(source)
        .execute(
            f"SELECT parent FROM edges WHERE child=? AND parent != child AND role IN ({_marks(PARENT_ROLES)}) "
            "ORDER BY rowid LIMIT 1",
            (candidate_id, *PARENT_ROLES),
        )
        .fetchone()
    )
    return row[0] if row else None


def primary_path(
    source: sqlite3.Connection | Store, candidate_id: str, *, limit: int = 100_000
) -> list[str]:
    """The chain of primary parents from the oldest ancestor to ``candidate_id`` (inclusive)."""
    conn = _conn(source)
    path, seen = [candidate_id], {candidate_id}
    while len(path) < limit:
        parent = primary_parent(conn, path[-1])
        if parent is None or parent in seen:
            break
        path.append(parent)
        seen.add(parent)
    return path[::-1]


def _add_nodes(graph: nx.DiGraph, conn: sqlite3.Connection, ids: list[str] | None) -> None:
    if ids is None:
        rows = conn.execute(_NODE_SQL).fetchall()
    else:
        rows = []
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            rows += conn.execute(f"{_NODE_SQL} WHERE c.id IN ({_marks(chunk)})", chunk).fetchall()
    elites = {row[0] for row in conn.execute("SELECT DISTINCT candidate FROM elites")}
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
        for cid, seq, op, model, status, island, fitness in rows
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
    def load(
        cls, source: sqlite3.Connection | Store, *, roles: Iterable[str] = PARENT_ROLES
    ) -> Lineage:
        """The whole archive's lineage over edges of the given roles."""
        conn = _conn(source)
        roles = tuple(roles)
        import networkx as nx  # imported when a graph is built: the helpers above need only SQL

        graph = nx.DiGraph()
        _add_nodes(graph, conn, None)
        edges = conn.execute(
            f"SELECT parent, child, role, rowid FROM edges WHERE role IN ({_marks(roles)}) AND parent != child",
            roles,
        )
        graph.add_edges_from((p, c, {"role": r, "order": o}) for p, c, r, o in edges)
        return cls(graph, direction=objective_direction(conn))

    @classmethod
    def around(
        cls,
        source: sqlite3.Connection | Store,
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
        conn = _conn(source)
        roles = tuple(roles)
        role_sql = f"role IN ({_marks(roles)}) AND parent != child"
        nodes: dict[str, None] = {candidate_id: None}
        edges: list[tuple[str, str, str, int]] = []
        frontier = [candidate_id]
        while frontier and len(nodes) < max_ancestors + 1:
            rows = conn.execute(
                f"SELECT parent, child, role, rowid FROM edges WHERE child IN ({_marks(frontier)}) AND {role_sql}",
                (*frontier, *roles),
            ).fetchall()
            frontier = []
            for row in rows:
                if len(nodes) > max_ancestors and row[0] not in nodes:
                    continue
                edges.append(row)
                if row[0] not in nodes:
                    nodes[row[0]] = None
                    frontier.append(row[0])
        children = conn.execute(
            f"SELECT parent, child, role, rowid FROM edges WHERE parent=? AND {role_sql} ORDER BY rowid LIMIT ?",
            (candidate_id, *roles, max_children),
        ).fetchall()
        edges += children
        nodes.update((row[1], None) for row in children)
        best = best_candidate(conn) if with_best_path else None
        if best is not None:
            path = primary_path(conn, best)
            nodes.update((cid, None) for cid in path)
            edges += [
                (parent, child, "path", -1) for parent, child in zip(path, path[1:], strict=False)
            ]
        import networkx as nx  # imported when a graph is built: the helpers above need only SQL

        graph = nx.DiGraph()
        _add_nodes(graph, conn, list(nodes))
        for parent, child, role, order in edges:
            if role == "path" and graph.has_edge(parent, child):
                continue
            if role == "path":  # the real role of a path edge, looked up only when not seen already
                found = conn.execute(
                    "SELECT role, rowid FROM edges WHERE parent=? AND child=? ORDER BY rowid LIMIT 1",
                    (parent, child),
                ).fetchone()
                role, order = found if found else ("mutation", -1)
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
