"""Reads of a run as a whole: its objective and best, counts, cost, the stats series and the grid."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

from evolve.harness import phases
from evolve.query import Source, connection
from evolve.store import runlock

REEVALUATION = "reevaluation"  # evolve.archive.noise's stage of re-evaluation samples (browsing never loads it)
SERIES_COLUMNS = ("evaluated", "best", "coverage", "qd_score", "cost", "failures", "created_at")


def objective_direction(source: Source) -> str:
    """Whether the run maximises ("max") or minimises ("min") its objective.

    Read from the ``objective`` state key when the run recorded it; otherwise inferred
    from the stats time series (the best value only ever moves in the good direction);
    "max" when nothing tells.
    """
    conn = connection(source)
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


def best_candidate(source: Source) -> str | None:
    """The id of the best elite over all islands (None for an archive without elites)."""
    conn = connection(source)
    order = "DESC" if objective_direction(conn) == "max" else "ASC"
    row = conn.execute(
        f"SELECT candidate FROM elites ORDER BY objective {order}, island, cell LIMIT 1"
    ).fetchone()
    return row[0] if row else None


def max_seq(source: Source) -> int | None:
    """The highest candidate number so far (None before the first)."""
    return connection(source).execute("SELECT MAX(seq) FROM candidates").fetchone()[0]


def run_info(source: Source) -> dict[str, Any]:
    """The run's benchmark, seed, status, start and end, and the best candidate."""
    conn = connection(source)
    row = conn.execute(
        "SELECT config, seed, status, reason, started_at, finished_at, hardware FROM runs ORDER BY id LIMIT 1"
    ).fetchone()
    last = conn.execute(
        "SELECT status, finished_at, reason FROM runs ORDER BY id DESC LIMIT 1"
    ).fetchone()
    resumes = conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    info: dict[str, Any] = {
        "benchmark": None,
        "seed": None,
        "status": "unknown",
        "started_at": None,
        "finished_at": None,
        "runs": resumes,
    }
    if row:
        config = json.loads(row[0]) if row[0] else {}
        bench = config.get("benchmark") if isinstance(config, dict) else None
        info.update(
            benchmark=bench.get("name") if isinstance(bench, dict) else bench,
            seed=row[1],
            started_at=row[4],
            hardware=row[6],
        )
    if last:
        info.update(status=last[0], finished_at=last[1], reason=last[2])
        if last[0] == "running" and not _live(conn):
            info.update(status="killed", reason="the process ended without closing the run")
    info["direction"] = objective_direction(conn)
    info["best"] = best_candidate(conn)
    info["best_fitness"] = None
    if info["best"]:
        info["best_fitness"] = conn.execute(
            "SELECT objective FROM elites WHERE candidate=? LIMIT 1", (info["best"],)
        ).fetchone()[0]
    # indexed lookups only: a full scan of candidates would read every file they hold
    first, count = conn.execute(
        "SELECT (SELECT created_at FROM candidates ORDER BY seq LIMIT 1), (SELECT COUNT(*) FROM candidates)"
    ).fetchone()
    latest = conn.execute(
        "SELECT MAX(t) FROM (SELECT MAX(created_at) AS t FROM stats UNION ALL "
        "SELECT created_at FROM evaluations WHERE id = (SELECT MAX(id) FROM evaluations) UNION ALL "
        "SELECT updated_at FROM candidates WHERE seq = (SELECT MAX(seq) FROM candidates))"
    ).fetchone()[0]
    info["first_candidate_at"], info["last_update_at"], info["candidates"] = first, latest, count
    return info


def _live(conn: sqlite3.Connection) -> bool:
    """Whether a process holds the writer lock of the run directory the archive lies in."""
    row = conn.execute("PRAGMA database_list").fetchone()
    return bool(row and row[2]) and runlock.held(Path(row[2]).parent)


def counts(source: Source) -> dict[str, int]:
    """Candidates by status, plus evaluations by status (prefixed ``eval_``)."""
    conn = connection(source)
    result = {
        status: n
        for status, n in conn.execute("SELECT status, COUNT(*) FROM candidates GROUP BY status")
    }
    result.update(
        {
            f"eval_{status}": n
            for status, n in conn.execute(
                "SELECT status, COUNT(*) FROM evaluations GROUP BY status"
            )
        }
    )
    return result


def cost(source: Source) -> dict[str, Any]:
    """LLM calls, tokens and USD, in total and per model."""
    per_model = [
        {
            "model": model,
            "calls": calls,
            "errors": errors or 0,
            "tokens_in": tin or 0,
            "tokens_out": tout or 0,
            "cost": c or 0.0,
            "latency_s": latency,
        }
        for model, calls, errors, tin, tout, c, latency in connection(source).execute(
            "SELECT model, COUNT(*), SUM(error IS NOT NULL AND error != ''), SUM(tokens_in), SUM(tokens_out), "
            "SUM(cost), AVG(latency_s) FROM llm_calls GROUP BY model ORDER BY SUM(cost) DESC"
        )
    ]
    return {
        "calls": sum(r["calls"] for r in per_model),
        "cost": sum(r["cost"] for r in per_model),
        "tokens_in": sum(r["tokens_in"] for r in per_model),
        "tokens_out": sum(r["tokens_out"] for r in per_model),
        "per_model": per_model,
    }


def fitness_series(source: Source, *, points: int = 500) -> list[dict[str, Any]]:
    """The ``stats`` time series, thinned to at most about ``points`` rows (the last row always kept)."""
    conn = connection(source)
    low, high, count = conn.execute("SELECT MIN(rowid), MAX(rowid), COUNT(*) FROM stats").fetchone()
    if not count:
        return []
    step = max(1, math.ceil(count / points))
    rows = conn.execute(
        f"SELECT {', '.join(SERIES_COLUMNS)} FROM stats WHERE (rowid - ?) % ? = 0 OR rowid = ? ORDER BY rowid",
        (low, step, high),
    ).fetchall()
    return [dict(zip(SERIES_COLUMNS, row, strict=True)) for row in rows]


def version(source: Source) -> str:
    """A token that changes whenever the run writes something the pages show (cheap: indexed maxima)."""
    row = (
        connection(source)
        .execute(
            "SELECT (SELECT MAX(seq) FROM candidates), (SELECT MAX(id) FROM evaluations), "
            "(SELECT MAX(updated_at) FROM elites), (SELECT MAX(id) FROM stats), (SELECT MAX(id) FROM llm_calls), "
            "(SELECT MAX(id) FROM runs), (SELECT status FROM runs ORDER BY id DESC LIMIT 1)"
        )
        .fetchone()
    )
    return "-".join(str(v) for v in row)


def islands(source: Source) -> list[int]:
    """The islands that hold elites, in order."""
    return [
        row[0]
        for row in connection(source).execute("SELECT DISTINCT island FROM elites ORDER BY island")
    ]


def elite_cells(source: Source, *, island: int | None = None) -> list[tuple[str, str, float]]:
    """(cell, candidate, objective) of every elite, or of one island's."""
    sql, args = "SELECT cell, candidate, objective FROM elites", ()
    if island is not None:
        sql, args = sql + " WHERE island=?", (island,)
    return connection(source).execute(sql, args).fetchall()


def grid_axes(source: Source) -> list[dict[str, Any]] | None:
    """The grid's descriptors ({name, low, high, bins}) as the run recorded them, or None."""
    row = connection(source).execute("SELECT value FROM state WHERE key='grid'").fetchone()
    return json.loads(row[0]).get("descriptors", []) if row else None


def latest_descriptor_names(source: Source) -> list[str]:
    """The descriptor names of the latest scored evaluation (for runs that recorded no grid)."""
    sample = (
        connection(source)
        .execute("SELECT descriptors FROM evaluations WHERE status='ok' ORDER BY id DESC LIMIT 1")
        .fetchone()
    )
    return list(json.loads(sample[0]).keys()) if sample and sample[0] else []


def time_breakdown(source: Source) -> dict[str, Any]:
    """Where the run's evaluation time went: seconds per phase (``time_<phase>`` metrics,
    ``evolve.harness.phases``) with each one's share of the evaluations' summed wall time.

    Every evaluation that ran counts except re-evaluation samples (their verdict row sums them);
    on a GPU benchmark the wall time is the slot's GPU time. Time that no phase accounts for
    (evaluations recorded before phases were) is the row "unmeasured".
    """
    conn = connection(source)
    wall, evaluations = conn.execute(
        "SELECT COALESCE(SUM(wall_s), 0), COUNT(*) FROM evaluations WHERE stage IS NOT ? AND wall_s > 0",
        (REEVALUATION,),
    ).fetchone()
    found = conn.execute(
        "SELECT j.key, SUM(j.value), COUNT(*) FROM evaluations e, json_each(e.metrics) j "
        "WHERE e.stage IS NOT ? AND j.key LIKE 'time^_%' ESCAPE '^' AND j.type IN ('real', 'integer') "
        "GROUP BY j.key",
        (REEVALUATION,),
    ).fetchall()
    rows = [
        {"phase": key.removeprefix(phases.PREFIX), "seconds": seconds, "evaluations": n}
        for key, seconds, n in found
        if phases.is_phase(key)
    ]
    unmeasured = wall - math.fsum(r["seconds"] for r in rows)
    if unmeasured > 1e-6 * max(wall, 1.0):
        rows.append({"phase": "unmeasured", "seconds": unmeasured, "evaluations": evaluations})
    for row in rows:
        row["share"] = row["seconds"] / wall if wall > 0 else 0.0
        row["mean_s"] = row["seconds"] / row["evaluations"]
    rows.sort(key=lambda r: -r["seconds"])
    return {"wall_s": wall, "evaluations": evaluations, "phases": rows}
