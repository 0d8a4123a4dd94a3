"""Reads of the lineage: parents, children, primary paths and the nodes of a lineage graph."""

from __future__ import annotations

from collections.abc import Sequence

from evolve.query import Source, connection, marks

PARENT_ROLES: tuple[str, ...] = ("mutation", "crossover", "migration")
ALL_ROLES: tuple[str, ...] = (*PARENT_ROLES, "inspiration")

Edge = tuple[str, str, str, int]  # parent, child, role, order (the edge's rowid)
Node = tuple[str, int, str, str | None, str, int, float | None]
# id, seq, operator, model, status, island, latest fitness

_NODE_SQL = (
    "SELECT c.id, c.seq, c.operator, c.model, c.status, c.island, "
    "(SELECT v.fitness FROM evaluations v WHERE v.candidate = c.id ORDER BY v.id DESC LIMIT 1) "
    "FROM candidates c"
)


def primary_parent(source: Source, candidate_id: str) -> str | None:
    """The parent the candidate's operator edited (its first non-inspiration parent)."""
    row = (
        connection(source)
        .execute(
            f"SELECT parent FROM edges WHERE child=? AND parent != child AND role IN ({marks(PARENT_ROLES)}) "
            "ORDER BY rowid LIMIT 1",
            (candidate_id, *PARENT_ROLES),
        )
        .fetchone()
    )
    return row[0] if row else None


def primary_path(source: Source, candidate_id: str, *, limit: int = 100_000) -> list[str]:
    """The chain of primary parents from the oldest ancestor to ``candidate_id`` (inclusive)."""
    conn = connection(source)
    path, seen = [candidate_id], {candidate_id}
    while len(path) < limit:
        parent = primary_parent(conn, path[-1])
        if parent is None or parent in seen:
            break
        path.append(parent)
        seen.add(parent)
    return path[::-1]


def parent_ids(
    source: Source, candidate_id: str, *, roles: Sequence[str] = PARENT_ROLES
) -> list[str]:
    """The candidate's parents of the given roles, primary first."""
    return [
        row[0]
        for row in connection(source).execute(
            f"SELECT parent FROM edges WHERE child=? AND parent != child AND role IN ({marks(roles)}) "
            "ORDER BY rowid",
            (candidate_id, *roles),
        )
    ]


def nodes(source: Source, ids: Sequence[str] | None = None) -> list[Node]:
    """The graph's nodes: every candidate (``ids`` None) or those named."""
    conn = connection(source)
    if ids is None:
        return conn.execute(_NODE_SQL).fetchall()
    rows: list[Node] = []
    for start in range(0, len(ids), 500):
        chunk = list(ids[start : start + 500])
        rows += conn.execute(f"{_NODE_SQL} WHERE c.id IN ({marks(chunk)})", chunk).fetchall()
    return rows


def elite_ids(source: Source) -> set[str]:
    """The candidates that hold a cell now."""
    return {row[0] for row in connection(source).execute("SELECT DISTINCT candidate FROM elites")}


def edges(source: Source, roles: Sequence[str]) -> list[Edge]:
    """Every edge of the given roles (self-edges left out)."""
    return (
        connection(source)
        .execute(
            f"SELECT parent, child, role, rowid FROM edges WHERE role IN ({marks(roles)}) AND parent != child",
            tuple(roles),
        )
        .fetchall()
    )


def edges_into(source: Source, children: Sequence[str], roles: Sequence[str]) -> list[Edge]:
    """The edges of the given roles that end at any of ``children``."""
    return (
        connection(source)
        .execute(
            f"SELECT parent, child, role, rowid FROM edges WHERE child IN ({marks(children)}) "
            f"AND role IN ({marks(roles)}) AND parent != child",
            (*children, *roles),
        )
        .fetchall()
    )


def edges_from(source: Source, parent: str, roles: Sequence[str], *, limit: int) -> list[Edge]:
    """The first ``limit`` edges of the given roles that start at ``parent``."""
    return (
        connection(source)
        .execute(
            f"SELECT parent, child, role, rowid FROM edges WHERE parent=? AND role IN ({marks(roles)}) "
            "AND parent != child ORDER BY rowid LIMIT ?",
            (parent, *roles, limit),
        )
        .fetchall()
    )


def edge_between(source: Source, parent: str, child: str) -> tuple[str, int] | None:
    """(role, order) of the first edge from ``parent`` to ``child``, if any."""
    return (
        connection(source)
        .execute(
            "SELECT role, rowid FROM edges WHERE parent=? AND child=? ORDER BY rowid LIMIT 1",
            (parent, child),
        )
        .fetchone()
    )


def children(source: Source, candidate_id: str, *, limit: int = 50) -> tuple[list[dict], int]:
    """The first ``limit`` children ({id, role}) of a candidate, and how many it has."""
    conn = connection(source)
    shown = [
        {"id": child, "role": role}
        for child, role in conn.execute(
            "SELECT child, role FROM edges WHERE parent=? AND child != parent ORDER BY rowid LIMIT ?",
            (candidate_id, limit),
        )
    ]
    count = conn.execute(
        "SELECT COUNT(*) FROM edges WHERE parent=? AND child != parent", (candidate_id,)
    ).fetchone()[0]
    return shown, count
