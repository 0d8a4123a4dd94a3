"""Read-only queries about elites and single candidates, returning plain dicts (CLI and web share them)."""

from __future__ import annotations

import difflib
import json
import sqlite3
from typing import Any

from evolve.callstore import prompt_messages
from evolve.lineage import PARENT_ROLES, objective_direction, primary_parent, primary_path

ELITE_SORTS = ("objective", "island", "cell", "seq", "operator", "model", "updated_at")


def _loads(text: str | None, default: Any) -> Any:
    if not text:
        return default
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return default


def elites(
    conn: sqlite3.Connection,
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
        "(SELECT v.metrics FROM evaluations v WHERE v.candidate = e.candidate ORDER BY v.id DESC LIMIT 1) "
        "FROM elites e JOIN candidates c ON c.id = e.candidate"
        + (" WHERE " + " AND ".join(where) if where else "")
        + f" ORDER BY {column} {'DESC' if descending else 'ASC'}, e.island, e.cell"
        + (" LIMIT ?" if limit is not None else "")
    )
    if limit is not None:
        args.append(limit)
    rows = conn.execute(sql, args).fetchall()
    keys = ("island", "cell", "id", "objective", "updated_at", "seq", "operator", "model")
    result = []
    for row in rows:
        item = dict(zip(keys, row[:8], strict=True))
        item["metrics"] = _loads(row[8], {})
        result.append(item)
    return result


def candidate(conn: sqlite3.Connection, candidate_id: str) -> dict[str, Any]:
    """Everything stored about one candidate: files, lineage, evaluations, cells, LLM calls."""
    row = conn.execute(
        "SELECT id, seq, files, operator, model, description, prompt_hash, island, status, created_at, updated_at "
        "FROM candidates WHERE id=?",
        (candidate_id,),
    ).fetchone()
    if row is None:
        raise KeyError(candidate_id)
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
    item = dict(zip(keys, row, strict=True))
    item["files"] = _loads(item["files"], {})
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
    item["children"] = [
        {"id": child, "role": role}
        for child, role in conn.execute(
            "SELECT child, role FROM edges WHERE parent=? AND child != parent ORDER BY rowid LIMIT 50",
            (candidate_id,),
        )
    ]
    item["children_count"] = conn.execute(
        "SELECT COUNT(*) FROM edges WHERE parent=? AND child != parent", (candidate_id,)
    ).fetchone()[0]
    item["evaluations"] = [
        {
            "stage": stage,
            "status": status,
            "fitness": fitness,
            "metrics": _loads(metrics, {}),
            "descriptors": _loads(descriptors, {}),
            "artifacts": _loads(artifacts, {}),
            "wall_s": wall_s,
            "seeds": _loads(seeds, []),
            "hardware": hardware,
            "created_at": created_at,
        }
        for stage, status, fitness, metrics, descriptors, artifacts, wall_s, seeds, hardware, created_at in conn.execute(
            "SELECT stage, status, fitness, metrics, descriptors, artifacts, wall_s, seeds, hardware, created_at "
            "FROM evaluations WHERE candidate=? ORDER BY id",
            (candidate_id,),
        )
    ]
    latest = item["evaluations"][-1] if item["evaluations"] else None
    item["fitness"] = latest["fitness"] if latest else None
    item["cells"] = [
        {"island": island, "cell": cell, "objective": objective}
        for island, cell, objective in conn.execute(
            "SELECT island, cell, objective FROM elites WHERE candidate=?", (candidate_id,)
        )
    ]
    item["llm_calls"] = [
        {
            "model": model,
            "messages": prompt_messages(conn, call_id),
            "response": response,
            "tokens_in": tin,
            "tokens_out": tout,
            "cost": cost,
            "latency_s": latency,
            "error": error,
            "created_at": created_at,
        }
        for call_id, model, response, tin, tout, cost, latency, error, created_at in conn.execute(
            "SELECT id, model, response, tokens_in, tokens_out, cost, latency_s, error, created_at "
            "FROM llm_calls WHERE candidate=? ORDER BY id",
            (candidate_id,),
        )
    ]
    return item


def files_of(conn: sqlite3.Connection, candidate_id: str) -> dict[str, str]:
    """A candidate's files ({path: text})."""
    row = conn.execute("SELECT files FROM candidates WHERE id=?", (candidate_id,)).fetchone()
    if row is None:
        raise KeyError(candidate_id)
    return _loads(row[0], {})


def diff_files(
    old: dict[str, str], new: dict[str, str], *, old_name: str, new_name: str, context: int = 3
) -> str:
    """A unified diff between two file sets (files added or removed included); empty when equal."""
    chunks = []
    for path in sorted(set(old) | set(new)):
        a, b = old.get(path), new.get(path)
        if a == b:
            continue
        chunks += difflib.unified_diff(
            (a or "").splitlines(keepends=True),
            (b or "").splitlines(keepends=True),
            fromfile=f"{old_name}/{path}" if a is not None else "/dev/null",
            tofile=f"{new_name}/{path}" if b is not None else "/dev/null",
            n=context,
        )
    text = "".join(line if line.endswith("\n") else line + "\n" for line in chunks)
    return text


def diff(conn: sqlite3.Connection, old_id: str, new_id: str, *, context: int = 3) -> str:
    """The unified diff from candidate ``old_id`` to candidate ``new_id``."""
    return diff_files(
        files_of(conn, old_id),
        files_of(conn, new_id),
        old_name=old_id[:10],
        new_name=new_id[:10],
        context=context,
    )


def parent_ids(
    conn: sqlite3.Connection, candidate_id: str, *, roles: tuple[str, ...] = PARENT_ROLES
) -> list[str]:
    """The candidate's parents of the given roles, primary first."""
    marks = ",".join("?" for _ in roles)
    return [
        r[0]
        for r in conn.execute(
            f"SELECT parent FROM edges WHERE child=? AND parent != child AND role IN ({marks}) ORDER BY rowid",
            (candidate_id, *roles),
        )
    ]


def ancestry(conn: sqlite3.Connection, candidate_id: str, *, depth: int = 30) -> dict[str, Any]:
    """The chain of primary parents leading to a candidate, oldest first (at most ``depth`` steps shown).

    Each row has the generation (0 = the oldest ancestor), operator, model, status,
    fitness, the change from the previous row and the candidate's other parents.
    """
    path = primary_path(conn, candidate_id)
    start = max(0, len(path) - depth)
    direction = objective_direction(conn)
    rows, previous = [], None
    for generation, cid in enumerate(path[start:], start):
        operator, model, status, fitness = conn.execute(
            "SELECT c.operator, c.model, c.status, (SELECT v.fitness FROM evaluations v WHERE v.candidate = c.id "
            "ORDER BY v.id DESC LIMIT 1) FROM candidates c WHERE c.id=?",
            (cid,),
        ).fetchone()
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
