"""Reads of candidates: the elites table, one candidate in full, its audit, its files, lookups by seq or id prefix."""

from __future__ import annotations

from typing import Any

from evolve.query import Source, connection, loads
from evolve.query.edges import PARENT_ROLES, children, primary_parent
from evolve.query.run import objective_direction
from evolve.store.calls import prompt_messages

ELITE_SORTS = ("objective", "island", "cell", "seq", "operator", "model", "updated_at")

_OUTCOMES_SQL = """
SELECT c.id, c.operator, c.model, c.status,
       (SELECT {pick}(v.fitness) FROM evaluations v WHERE v.candidate = c.id AND v.status = 'ok'
        AND v.stage NOT IN ('reevaluation', 'strict')),
       (SELECT {pick}(v.fitness) FROM edges e JOIN evaluations v ON v.candidate = e.parent AND v.status = 'ok'
        AND v.stage NOT IN ('reevaluation', 'strict')
        WHERE e.child = c.id AND e.role IN ({roles}) AND e.parent != e.child)
FROM candidates c WHERE c.seq >= ?
"""


def elites(
    source: Source,
    *,
    limit: int | None = 10,
    island: int | None = None,
    cell: str | None = None,
    sort: str = "objective",
    descending: bool | None = None,
) -> list[dict[str, Any]]:
    """Elites with their candidate's operator, model and metrics, best first by default.

    Args:
        limit: at most this many rows (None: all).
        island: only this island.
        cell: only cells whose key starts with this text ("3," matches row 3).
        sort: one of ``ELITE_SORTS``.
        descending: sort order; by default best first for ``objective``, ascending otherwise.
    """
    conn = connection(source)
    if sort not in ELITE_SORTS:
        raise ValueError(f"cannot sort by {sort!r}: choose one of {', '.join(ELITE_SORTS)}")
    if descending is None:
        descending = sort == "objective" and objective_direction(conn) == "max"
    where, args = [], []
    if island is not None:
        where.append("e.island = ?")
        args.append(island)
    if cell:
        where.append("e.cell >= ? AND e.cell < ?")
        args += [cell, cell + "\U0010ffff"]
    column = {"seq": "c.seq", "operator": "c.operator", "model": "c.model"}.get(sort, f"e.{sort}")
    sql = (
        "SELECT e.island, e.cell, e.candidate, e.objective, e.updated_at, c.seq, c.operator, c.model, "
        "(SELECT v.metrics FROM evaluations v WHERE v.candidate = e.candidate ORDER BY v.id DESC LIMIT 1), "
        "a.decision, a.flagged "
        "FROM elites e LEFT JOIN audits a ON a.candidate = e.candidate "
        "JOIN candidates c ON c.id = e.candidate"
        + (" WHERE " + " AND ".join(where) if where else "")
        + f" ORDER BY {column} {'DESC' if descending else 'ASC'}, e.island, e.cell"
        + (" LIMIT ?" if limit is not None else "")
    )
    if limit is not None:
        args.append(limit)
    keys = ("island", "cell", "id", "objective", "updated_at", "seq", "operator", "model")
    result = []
    for row in conn.execute(sql, args).fetchall():
        item = dict(zip(keys, row[:8], strict=True))
        item["metrics"] = loads(row[8], {})
        item["audit"] = _audit_mark(row[9], row[10])
        result.append(item)
    return result


def _audit_mark(decision: str | None, flagged: int | None) -> str | None:
    """How ``best`` marks an elite: None (not audited), ``clean`` or ``flagged, <decision>``."""
    if decision is None:
        return None
    return f"flagged, {decision}" if flagged else "clean"


def audit_of(source: Source, candidate_id: str) -> dict[str, Any] | None:
    """The auditor's verdict on a candidate (None when it was never audited).

    Keys: ``flagged``, ``decision`` (clean, promoted or refused), ``reason``, ``flags`` (each
    with path, line, rule, reason and code), ``unparsed`` files, ``strict_fitness``, and
    ``review``: the model's review (verdict, reasons, model, prompt_hash) or None.
    """
    row = (
        connection(source)
        .execute(
            "SELECT flagged, decision, reason, flags, unparsed, strict_fitness, created_at, "
            "review_verdict, review, review_model, review_prompt_hash FROM audits WHERE candidate=?",
            (candidate_id,),
        )
        .fetchone()
    )
    if row is None:
        return None
    keys = ("flagged", "decision", "reason", "flags", "unparsed", "strict_fitness", "created_at")
    item = dict(zip(keys, row[:7], strict=True))
    item.update(flagged=bool(row[0]), flags=loads(row[3], []), unparsed=loads(row[4], []))
    review = dict(zip(("verdict", "reasons", "model", "prompt_hash"), row[7:], strict=True))
    item["review"] = review if row[7] is not None else None
    return item


def candidate(source: Source, candidate_id: str) -> dict[str, Any]:
    """Everything stored about one candidate: files, lineage, evaluations, audit, cells, LLM calls.

    Raises:
        KeyError: no candidate has this id.
    """
    conn = connection(source)
    keys = (
        "id",
        "seq",
        "files",
        "operator",
        "model",
        "description",
        "prompt_hash",
        "island",
        "status",
        "created_at",
        "updated_at",
    )
    row = conn.execute(
        f"SELECT {', '.join(keys)} FROM candidates WHERE id=?", (candidate_id,)
    ).fetchone()
    if row is None:
        raise KeyError(candidate_id)
    item = dict(zip(keys, row, strict=True))
    item["files"] = loads(item["files"], {})
    item["parents"] = [
        {"id": parent, "role": role, "fitness": fitness, "operator": operator}
        for parent, role, fitness, operator in conn.execute(
            "SELECT e.parent, e.role, (SELECT v.fitness FROM evaluations v WHERE v.candidate = e.parent "
            "ORDER BY v.id DESC LIMIT 1), c.operator FROM edges e LEFT JOIN candidates c ON c.id = e.parent "
            "WHERE e.child=? ORDER BY e.rowid",
            (candidate_id,),
        )
    ]
    item["primary_parent"] = primary_parent(conn, candidate_id)
    item["children"], item["children_count"] = children(conn, candidate_id, limit=50)
    columns = (
        "stage",
        "status",
        "fitness",
        "metrics",
        "descriptors",
        "artifacts",
        "wall_s",
        "seeds",
    )
    columns += ("hardware", "created_at")
    item["evaluations"] = [
        dict(
            zip(columns, row, strict=True),
            metrics=loads(row[3], {}),
            descriptors=loads(row[4], {}),
            artifacts=loads(row[5], {}),
            seeds=loads(row[7], []),
        )
        for row in conn.execute(
            f"SELECT {', '.join(columns)} FROM evaluations WHERE candidate=? ORDER BY id",
            (candidate_id,),
        )
    ]
    item["audit"] = audit_of(conn, candidate_id)
    latest = item["evaluations"][-1] if item["evaluations"] else None
    item["fitness"] = latest["fitness"] if latest else None
    item["cells"] = [
        {"island": island, "cell": cell, "objective": objective}
        for island, cell, objective in conn.execute(
            "SELECT island, cell, objective FROM elites WHERE candidate=?", (candidate_id,)
        )
    ]
    calls = ("id", "model", "response", "tokens_in", "tokens_out", "cost", "latency_s")
    calls += ("error", "created_at")
    item["llm_calls"] = [
        dict(zip(calls[1:], row[1:], strict=True), messages=prompt_messages(conn, row[0]))
        for row in conn.execute(
            f"SELECT {', '.join(calls)} FROM llm_calls WHERE candidate=? ORDER BY id",
            (candidate_id,),
        )
    ]
    return item


def files_of(source: Source, candidate_id: str) -> dict[str, str]:
    """A candidate's files ({path: text}).

    Raises:
        KeyError: no candidate has this id.
    """
    row = (
        connection(source)
        .execute("SELECT files FROM candidates WHERE id=?", (candidate_id,))
        .fetchone()
    )
    if row is None:
        raise KeyError(candidate_id)
    return loads(row[0], {})


def brief(source: Source, candidate_id: str) -> tuple[str, str | None, str, float | None]:
    """(operator, model, status, latest fitness) of one candidate."""
    return (
        connection(source)
        .execute(
            "SELECT c.operator, c.model, c.status, (SELECT v.fitness FROM evaluations v WHERE v.candidate = c.id "
            "ORDER BY v.id DESC LIMIT 1) FROM candidates c WHERE c.id=?",
            (candidate_id,),
        )
        .fetchone()
    )


def outcomes(
    source: Source, *, since_seq: int
) -> list[tuple[str, str, str | None, str, float | None, float | None]]:
    """Per candidate from ``since_seq`` on: (id, operator, model, status, its best scored
    fitness, its best parent's), best in the objective's direction; re-evaluations left out."""
    conn = connection(source)
    pick = "MAX" if objective_direction(conn) == "max" else "MIN"
    sql = _OUTCOMES_SQL.format(pick=pick, roles=",".join(f"'{r}'" for r in PARENT_ROLES))
    return conn.execute(sql, (since_seq,)).fetchall()


def id_of_seq(source: Source, seq: int) -> str | None:
    """The id of candidate number ``seq``."""
    row = connection(source).execute("SELECT id FROM candidates WHERE seq=?", (seq,)).fetchone()
    return row[0] if row else None


def ids_with_prefix(source: Source, prefix: str, *, limit: int = 6) -> list[str]:
    """Up to ``limit`` candidate ids that start with ``prefix``, in order."""
    return [
        row[0]
        for row in connection(source).execute(
            "SELECT id FROM candidates WHERE id >= ? AND id < ? ORDER BY id LIMIT ?",
            (prefix, prefix + "\U0010ffff", limit),
        )
    ]
