"""Run-level summaries for ``stats`` and the overview page: counts, success rates, cost, time series."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from evolve.lineage import best_candidate, objective_direction
from evolve.plots import DEFAULT_WINDOW, fitness_series, success_rates


def run_info(conn: sqlite3.Connection) -> dict[str, Any]:
    """The run's benchmark, seed, status, start and end, and the best candidate."""
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


def counts(conn: sqlite3.Connection) -> dict[str, int]:
    """Candidates by status, plus evaluations by status (prefixed ``eval_``)."""
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


def cost(conn: sqlite3.Connection) -> dict[str, Any]:
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
        for model, calls, errors, tin, tout, c, latency in conn.execute(
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


def stats(
    conn: sqlite3.Connection, *, points: int = 20, last: int | None = DEFAULT_WINDOW
) -> dict[str, Any]:
    """Everything ``stats`` shows: run info, counts, success per operator and model (over the
    ``last`` candidates; None: all), cost, time series."""
    return {
        "run": run_info(conn),
        "counts": counts(conn),
        "success": success_rates(conn, last=last),
        "cost": cost(conn),
        "series": fitness_series(conn, points=points),
    }
