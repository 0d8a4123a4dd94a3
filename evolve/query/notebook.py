"""Reads the research notebook is built from and shown with: every proposal's outcome, the
noise measured by re-evaluations, the children of given parents, the stored notebook rows."""

from __future__ import annotations

import statistics
from typing import Any

from evolve.query import Source, connection, marks
from evolve.query.edges import PARENT_ROLES
from evolve.store.calls import unpack_text

_VERDICT = (
    "(SELECT {column} FROM evaluations v WHERE v.candidate = c.id "
    "AND v.stage NOT IN ('reevaluation', 'strict') ORDER BY v.id DESC LIMIT 1)"
)
_ATTEMPTS_SQL = f"""
SELECT c.id, c.seq, c.operator, c.model, c.island, c.status, c.description,
       (SELECT e.parent FROM edges e WHERE e.child = c.id AND e.parent != e.child
        AND e.role IN ({marks(PARENT_ROLES)}) ORDER BY e.rowid LIMIT 1),
       {_VERDICT.format(column="v.fitness")},
       {_VERDICT.format(column="json_extract(v.artifacts, '$.error')")},
       {_VERDICT.format(column="json_extract(v.artifacts, '$.answer')")},
       {_VERDICT.format(column="json_extract(v.artifacts, '$.twin')")}
FROM candidates c WHERE c.seq > ? {{where}} ORDER BY c.seq
"""
ATTEMPT_FIELDS = (
    "id",
    "seq",
    "operator",
    "model",
    "island",
    "status",
    "description",
    "parent",
    "fitness",
    "error",
    "answer",
    "twin",
)


def attempts(source: Source, *, after_seq: int = 0) -> list[dict[str, Any]]:
    """Every proposal after ``after_seq`` (the seed is 0), oldest first: ``ATTEMPT_FIELDS``.

    ``fitness`` is the verdict's (re-evaluations left out), ``error`` why it failed or was
    refused, ``answer`` the model's answer to a refused proposal ('' when there was none,
    e.g. the engine refused the request itself), ``twin`` the stored program a scored one
    equals (kept out of the archive; None otherwise).
    """
    rows = connection(source).execute(_ATTEMPTS_SQL.format(where=""), (*PARENT_ROLES, after_seq))
    return [dict(zip(ATTEMPT_FIELDS, row, strict=True)) for row in rows]


def children_attempts(source: Source, parent_ids: list[str], *, limit: int) -> list[dict[str, Any]]:
    """The ``limit`` newest proposals made from any of ``parent_ids``, newest first."""
    if not parent_ids:
        return []
    where = (
        f"AND c.id IN (SELECT child FROM edges WHERE parent IN ({marks(parent_ids)}) "
        f"AND role IN ({marks(PARENT_ROLES)}) AND child != parent)"
    )
    rows = connection(source).execute(
        _ATTEMPTS_SQL.format(where=where) + " DESC LIMIT ?",
        (*PARENT_ROLES, 0, *parent_ids, *PARENT_ROLES, limit),
    )
    return [dict(zip(ATTEMPT_FIELDS, row, strict=True)) for row in rows]


def noise_sd(source: Source) -> float | None:
    """The pooled standard deviation of repeated evaluations of the same program (None: none repeated)."""
    samples: dict[str, list[float]] = {}
    for candidate, fitness in connection(source).execute(
        "SELECT candidate, fitness FROM evaluations WHERE status = 'ok' AND fitness IS NOT NULL "
        "AND stage != 'strict' AND candidate IN "
        "(SELECT candidate FROM evaluations WHERE stage = 'reevaluation') ORDER BY id"
    ):
        samples.setdefault(candidate, []).append(fitness)
    repeated = [values for values in samples.values() if len(values) > 1]
    if not repeated:
        return None
    dof = sum(len(values) - 1 for values in repeated)
    return (sum(statistics.variance(v) * (len(v) - 1) for v in repeated) / dof) ** 0.5


def note_at(source: Source, seq: int, kind: str = "notes") -> dict[str, Any] | None:
    """The newest notebook row of ``kind`` made at or before proposal ``seq`` ({seq, text, model})."""
    conn = connection(source)
    row = conn.execute(
        "SELECT seq, text, packed, base, model FROM notebook WHERE kind = ? AND seq <= ? "
        "ORDER BY seq DESC LIMIT 1",
        (kind, seq),
    ).fetchone()
    if row is None:
        return None
    found, text, packed, base, model = row
    if packed is not None:
        primer = None
        if base is not None:
            (primer,) = conn.execute(
                "SELECT packed FROM notebook WHERE seq = ? AND kind = 'notes'", (base,)
            ).fetchone()
        text = unpack_text(packed, primer)
    return {"seq": found, "text": text, "model": model}


def notebook_at(source: Source, seq: int | None = None) -> dict[str, Any]:
    """What browsing shows: the notebook proposal ``seq`` was shown (None: the latest) and every version.

    Returns ``{seq, text, versions}``; ``seq`` and ``text`` are None when there is none yet.
    """
    row = note_at(source, seq if seq is not None else 2**62)
    return {
        "seq": row["seq"] if row else None,
        "text": row["text"] if row else None,
        "versions": note_history(source),
    }


def note_history(source: Source) -> list[dict[str, Any]]:
    """Every notebook row ({seq, kind, model, chars}), oldest first (the text itself is not read)."""
    return [
        dict(zip(("seq", "kind", "model", "chars"), row, strict=True))
        for row in connection(source).execute(
            "SELECT seq, kind, model, chars FROM notebook ORDER BY seq, kind"
        )
    ]
