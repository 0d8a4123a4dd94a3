"""The archive file's schema: the migrations that build its tables, in order.

A new archive runs them all; an older one runs those it lacks (``evolve.store.database.Store``
applies each in its own transaction and sets ``PRAGMA user_version`` to its number). A
migration is never edited once released: a change to the schema is a new function at the
end of ``MIGRATIONS``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from evolve.store.calls import NOTE_BASE_USES, PromptPacker, cap_answer

if TYPE_CHECKING:
    import sqlite_utils

APPLICATION_ID = 0x45564F4C  # "EVOL": marks a file as an evolve archive


def _candidate_rows(
    db: sqlite_utils.Database, table: str, columns: dict[str, Any], *, pk: str
) -> None:
    """Create ``table``, whose ``candidate`` column names a row of ``candidates`` (indexed)."""
    db[table].create(columns, pk=pk, foreign_keys=[("candidate", "candidates", "id")])
    if pk != "candidate":
        db[table].create_index(["candidate"])


def _migration_1(db: sqlite_utils.Database) -> None:
    db["runs"].create(
        {
            "id": int,
            "config": str,
            "harness_hash": str,
            "seed": int,
            "hardware": str,
            "started_at": float,
            "finished_at": float,
            "status": str,
            "reason": str,
        },
        pk="id",
    )
    db["candidates"].create(
        {
            "id": str,
            "seq": int,
            "files": str,
            "norm_hash": str,
            "operator": str,
            "model": str,
            "description": str,
            "prompt_hash": str,
            "island": int,
            "status": str,
            "created_at": float,
            "updated_at": float,
        },
        pk="id",
    )
    db["candidates"].create_index(["seq"], unique=True)
    db["candidates"].create_index(["norm_hash"])
    db["candidates"].create_index(["status"])
    _candidate_rows(
        db,
        "evaluations",
        {
            "id": int,
            "candidate": str,
            "stage": str,
            "status": str,
            "fitness": float,
            "metrics": str,
            "descriptors": str,
            "artifacts": str,
            "wall_s": float,
            "seeds": str,
            "hardware": str,
            "created_at": float,
        },
        pk="id",
    )
    db["edges"].create(
        {"child": str, "parent": str, "role": str, "created_at": float},
        pk=("child", "parent", "role"),
    )
    db["edges"].create_index(["parent"])
    db["elites"].create(
        {"island": int, "cell": str, "candidate": str, "objective": float, "updated_at": float},
        pk=("island", "cell"),
    )
    db["llm_calls"].create(
        {
            "id": int,
            "candidate": str,
            "model": str,
            "prompt_hash": str,
            "cache_key": str,
            "messages": str,
            "response": str,
            "tokens_in": int,
            "tokens_out": int,
            "cost": float,
            "latency_s": float,
            "error": str,
            "created_at": float,
        },
        pk="id",
    )
    db["llm_calls"].create_index(["cache_key"])
    db["stats"].create(
        {
            "id": int,
            "evaluated": int,
            "best": float,
            "coverage": float,
            "qd_score": float,
            "cost": float,
            "failures": int,
            "created_at": float,
        },
        pk="id",
    )
    db["state"].create({"key": str, "value": str}, pk="key")


def _migration_2(db: sqlite_utils.Database) -> None:
    """Covering indexes for browsing large archives without reading candidates' files (issue 7)."""
    db.execute(
        "CREATE INDEX IF NOT EXISTS idx_candidates_browse ON candidates (seq, id, operator, model, status)"
    )
    db.execute(
        "CREATE INDEX IF NOT EXISTS idx_evaluations_browse ON evaluations (candidate, status, fitness)"
    )
    db.execute("CREATE INDEX IF NOT EXISTS idx_llm_calls_candidate ON llm_calls (candidate)")
    db.execute(
        "CREATE INDEX IF NOT EXISTS idx_llm_calls_browse ON llm_calls "
        "(model, cost, tokens_in, tokens_out, latency_s, error)"
    )


def _migration_3(db: sqlite_utils.Database) -> None:
    """``llm_calls`` stores prompts compressed against a base prompt, answers capped, a status (issue 16).

    ``messages`` (JSON text) becomes ``prompt`` (zlib, see ``pack_prompt``) with ``prompt_base``;
    ``status`` is ok / error / cancelled; ``answer_chars`` is the answer's full length.
    """
    conn = db.conn
    conn.execute("ALTER TABLE llm_calls ADD COLUMN prompt BLOB")
    conn.execute("ALTER TABLE llm_calls ADD COLUMN prompt_base INTEGER")
    conn.execute("ALTER TABLE llm_calls ADD COLUMN status TEXT")
    conn.execute("ALTER TABLE llm_calls ADD COLUMN answer_chars INTEGER")
    packer = PromptPacker()
    rows = conn.execute(
        "SELECT id, messages, response, error FROM llm_calls ORDER BY id"
    ).fetchall()
    for call_id, messages, response, error in rows:
        blob, base = packer.pack(call_id, messages or "[]")
        answer = None if response is None else cap_answer(response)
        conn.execute(
            "UPDATE llm_calls SET prompt=?, prompt_base=?, status=?, response=?, answer_chars=? WHERE id=?",
            (
                blob,
                base,
                "ok" if error is None else "error",
                answer,
                None if response is None else len(response),
                call_id,
            ),
        )
    conn.execute("ALTER TABLE llm_calls DROP COLUMN messages")


def _migration_4(db: sqlite_utils.Database) -> None:
    """The schedule: each proposal's request and the order of the events that changed the run (issue 16)."""
    db["schedule"].create(
        {"seq": int, "ask": str, "asked": int, "admitted": int, "told": int}, pk="seq"
    )


def _migration_5(db: sqlite_utils.Database) -> None:
    """The auditor's verdict on each candidate that was about to become the run's best (issue 15).

    ``flags``: JSON list of {path, line, rule, reason, code}; ``decision``: clean (no flags),
    promoted (flagged, the strict re-evaluation confirmed) or refused; ``strict_fitness``:
    the mean of the strict re-evaluations (null when none was OK or none ran).
    """
    _candidate_rows(
        db,
        "audits",
        {
            "candidate": str,
            "flagged": int,
            "flags": str,
            "unparsed": str,
            "decision": str,
            "reason": str,
            "strict_fitness": float,
            "created_at": float,
        },
        pk="candidate",
    )


def _migration_6(db: sqlite_utils.Database) -> None:
    """The research notebook (issue 17), one row per version (``evolve.research.notebook``).

    ``kind`` ``notes``: the notebook the proposals from ``seq`` on are shown (written at an
    ask only when it changed); ``summary``: a model's summary of it, made during proposal
    ``seq`` by ``model`` (its call is in ``llm_calls`` under ``prompt_hash``).
    """
    db["notebook"].create(
        {
            "seq": int,
            "kind": str,
            "text": str,
            "model": str,
            "prompt_hash": str,
            "created_at": float,
        },
        pk=("seq", "kind"),
    )


def _migration_7(db: sqlite_utils.Database) -> None:
    """A model's review of each audited candidate's change (issue 15; ``evolve.research.review``).

    ``review_verdict``: clean, suspicious, malformed or unavailable (null: no model reviewed
    it); ``review``: its reasons, or the answer or error when there is no verdict;
    ``review_prompt_hash``: its call in ``llm_calls``.
    """
    for column in ("review_verdict", "review", "review_model", "review_prompt_hash"):
        db.conn.execute(f"ALTER TABLE audits ADD COLUMN {column} TEXT")


def _migration_8(db: sqlite_utils.Database) -> None:
    """Notebook versions are stored packed, as prompts are (issue 33): one per change, not a full copy.

    A ``notes`` row keeps ``text`` null and stores ``packed`` (zlib, ``PromptPacker``) with
    ``base``, the ``seq`` of the ``notes`` row whose text primed it (null: it is self-contained);
    ``chars`` is every row's text length. ``summary`` rows keep their text in ``text``.
    """
    conn = db.conn
    conn.execute("ALTER TABLE notebook ADD COLUMN packed BLOB")
    conn.execute("ALTER TABLE notebook ADD COLUMN base INTEGER")
    conn.execute("ALTER TABLE notebook ADD COLUMN chars INTEGER")
    conn.execute("UPDATE notebook SET chars = LENGTH(text)")
    packer = PromptPacker(NOTE_BASE_USES)
    rows = conn.execute(
        "SELECT seq, text FROM notebook WHERE kind = 'notes' ORDER BY seq"
    ).fetchall()
    for seq, text in rows:
        packed, base = packer.pack(seq, text)
        conn.execute(
            "UPDATE notebook SET text = NULL, packed = ?, base = ? WHERE seq = ? AND kind = 'notes'",
            (packed, base, seq),
        )


MIGRATIONS: tuple[Callable[[sqlite_utils.Database], None], ...] = (
    _migration_1,
    _migration_2,
    _migration_3,
    _migration_4,
    _migration_5,
    _migration_6,
    _migration_7,
    _migration_8,
)
SCHEMA_VERSION = len(MIGRATIONS)
