"""The SQLite archive file: opened (and migrated, ``evolve.store.schema``), WAL, one transaction per state change.

The database is the run's single source of truth and its checkpoint. Nothing is ever
deleted. The migrations create tables through sqlite-utils; the writes on the hot path
(one per candidate) are plain prepared statements, which are several times faster than
sqlite-utils' introspecting ``insert``.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolve.store.calls import NOTE_BASE_USES, PromptPacker, cap_answer
from evolve.store.schema import APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION
from evolve.types import (
    Candidate,
    CandidateStatus,
    EdgeRole,
    EvalStatus,
    Evaluation,
    EvolveError,
    Proposal,
)

if TYPE_CHECKING:
    import sqlite_utils


class ArchiveFileError(EvolveError):
    """The archive file is missing, corrupt, foreign or from a newer evolve."""


class ArchiveNeedsMigration(ArchiveFileError):
    """An archive written by an older evolve, opened read-only: ``migrate`` upgrades it."""


def migrate(path: Path | str) -> Path | None:
    """Upgrade the archive at ``path``, written by an older evolve, to this one's schema in place.

    A copy of the file as it was is kept beside it (``<name>.schema<N>.bak``) and returned;
    None when the archive is already current. Other problems (not an archive, newer, corrupt)
    raise ``ArchiveFileError`` as ``Store`` does, and nothing is written.
    """
    path = Path(path)
    try:
        Store(path, readonly=True).close()
        return None
    except ArchiveNeedsMigration:
        pass
    uri = f"file:{path}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as source:
        version = source.execute("PRAGMA user_version").fetchone()[0]
        backup = path.with_name(f"{path.name}.schema{version}.bak")
        with contextlib.closing(sqlite3.connect(backup)) as copy:
            source.backup(copy)
    Store(path).close()
    return backup


def _now() -> float:
    return time.time()


def _dumps(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


class Store:
    """One run's archive file.

    Args:
        path: the ``archive.db`` file; created (with the current schema) when missing
            unless ``readonly``.
        readonly: open without write access (browsing); never migrates.
    """

    def __init__(self, path: Path | str, *, readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self._note_packer = PromptPacker(NOTE_BASE_USES)
        if readonly and not self.path.exists():
            raise ArchiveFileError(
                f"no archive at {self.path}: pass a run directory or its archive.db"
            )
        uri = f"file:{self.path}?mode=ro" if readonly else f"file:{self.path}"
        conn = sqlite3.connect(
            uri, uri=True, isolation_level=None, check_same_thread=False, timeout=30
        )
        self.conn = conn
        try:
            self._check_and_migrate()
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
            conn.close()
            raise ArchiveFileError(
                f"{self.path} is not a readable SQLite archive ({exc}); nothing was written to it. "
                f"Recover what it holds with `sqlite3 {self.path} .recover | sqlite3 recovered.db`, "
                "point at another run directory, or move the file away to start a new run"
            ) from exc

    @cached_property
    def db(self) -> sqlite_utils.Database:
        """sqlite-utils over the same connection (imported on first use: browsing never needs it)."""
        import sqlite_utils

        return sqlite_utils.Database(self.conn)

    def _check_and_migrate(self) -> None:
        app_id = self.conn.execute("PRAGMA application_id").fetchone()[0]
        version = self.conn.execute("PRAGMA user_version").fetchone()[0]
        tables = [
            r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        ]
        if app_id != APPLICATION_ID and tables:
            raise ArchiveFileError(
                f"{self.path} is a SQLite file but not an evolve archive (tables: {', '.join(tables[:5])}); "
                "choose another run directory"
            )
        if version > SCHEMA_VERSION:
            raise ArchiveFileError(
                f"{self.path} has schema version {version}, newer than this evolve ({SCHEMA_VERSION}); "
                "upgrade evolve to open it"
            )
        if self.readonly:
            if not tables:
                raise ArchiveFileError(
                    f"{self.path} is an empty SQLite file, not an archive (no run wrote to it, or "
                    "its rows are in a -wal file left behind): pass another run directory"
                )
            if version < SCHEMA_VERSION:
                raise ArchiveNeedsMigration(
                    f"{self.path} was written by an older evolve (schema {version}; this one "
                    f"reads {SCHEMA_VERSION}): upgrade it with `python -m evolve.browse {self.path} migrate`"
                )
            return
        if tables and (damage := self.conn.execute("PRAGMA quick_check").fetchone()[0]) != "ok":
            raise sqlite3.DatabaseError(f"damaged: {damage}")  # before anything is written to it
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("PRAGMA foreign_keys=ON")
        for number in range(version, SCHEMA_VERSION):
            with self.transaction():
                MIGRATIONS[number](self.db)
                self.conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
                self.conn.execute(f"PRAGMA user_version={number + 1}")

    def close(self) -> None:
        self.conn.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """All writes inside are one atomic transaction (BEGIN IMMEDIATE ... COMMIT)."""
        if self.conn.in_transaction:  # nested: join the outer transaction
            yield
            return
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    # --- runs -------------------------------------------------------------------------

    def start_run(
        self, *, config: Mapping[str, Any], harness_hash: str, seed: int, hardware: str
    ) -> int:
        with self.transaction():
            cursor = self.conn.execute(
                "INSERT INTO runs (config, harness_hash, seed, hardware, started_at, status) VALUES (?,?,?,?,?,?)",
                (_dumps(config), harness_hash, seed, hardware, _now(), "running"),
            )
        return int(cursor.lastrowid)

    def finish_run(self, run_id: int, *, status: str, reason: str = "") -> None:
        with self.transaction():
            self.conn.execute(
                "UPDATE runs SET finished_at=?, status=?, reason=? WHERE id=?",
                (_now(), status, reason, run_id),
            )

    def end_dead_sessions(self) -> tuple[int, int]:
        """Close what a session killed without warning (SIGKILL, a lost machine) left open: its
        ``running`` run row reads ``killed``, its calls in flight read ``lost``; returns how many
        of each. Call it holding the run's lock (no other session is alive)."""
        with self.transaction():
            runs = self.conn.execute(
                "UPDATE runs SET status='killed', finished_at=?, reason=? WHERE status='running'",
                (_now(), "the process ended without closing the run (killed, or its machine lost)"),
            ).rowcount
            calls = self.conn.execute(
                "UPDATE llm_calls SET status='lost', error=? WHERE status='pending'",
                (
                    "in flight when the run was killed: its answer was never received; the "
                    "provider may have billed it",
                ),
            ).rowcount
        return runs, calls

    def first_run(self) -> dict[str, Any] | None:
        """The row of the run that started this archive, or None."""
        return self._run_row("ORDER BY id LIMIT 1")

    def latest_run(self) -> dict[str, Any] | None:
        """The row of the latest start or resume, whose config carries the budgets last given."""
        return self._run_row("ORDER BY id DESC LIMIT 1")

    def _run_row(self, order: str) -> dict[str, Any] | None:
        cursor = self.conn.execute(f"SELECT * FROM runs {order}")
        names = [c[0] for c in cursor.description]
        rows = [dict(zip(names, row, strict=True)) for row in cursor]
        return rows[0] if rows else None

    # --- candidates ---------------------------------------------------------------------

    def has_candidate(self, candidate_id: str) -> bool:
        return (
            self.conn.execute("SELECT 1 FROM candidates WHERE id=?", (candidate_id,)).fetchone()
            is not None
        )

    def next_seq(self) -> int:
        """The first proposal number not yet used by a candidate or an issued request."""
        return int(
            self.conn.execute(
                "SELECT MAX(COALESCE((SELECT MAX(seq) FROM candidates), -1), "
                "COALESCE((SELECT MAX(seq) FROM schedule), -1)) + 1"
            ).fetchone()[0]
        )

    def seed_candidate(self) -> Candidate | None:
        """The seed program (the candidate with seq 0), or None before it is stored."""
        row = self.conn.execute("SELECT id FROM candidates WHERE seq=0").fetchone()
        return None if row is None else self.candidate(row[0])

    def status_counts(self) -> dict[CandidateStatus, int]:
        """How many candidates are in each status."""
        rows = self.conn.execute("SELECT status, COUNT(*) FROM candidates GROUP BY status")
        return {CandidateStatus(status): n for status, n in rows}

    def link_calls(self, prompt_hash: str | None, candidate_id: str) -> None:
        """Point the not yet linked LLM calls made for ``prompt_hash`` at the candidate they produced."""
        if prompt_hash:
            self.conn.execute(
                "UPDATE llm_calls SET candidate=? WHERE prompt_hash=? AND candidate IS NULL",
                (candidate_id, prompt_hash),
            )

    def has_equivalent(self, norm_hash: str) -> str | None:
        """The id of a candidate with the same normalised code, if any."""
        row = self.conn.execute(
            "SELECT id FROM candidates WHERE norm_hash=? LIMIT 1", (norm_hash,)
        ).fetchone()
        return row[0] if row else None

    def add_candidate(
        self,
        proposal: Proposal,
        *,
        seq: int,
        status: CandidateStatus = CandidateStatus.PROPOSED,
        norm_hash: str | None = None,
        candidate_id: str | None = None,
    ) -> Candidate:
        """Insert a proposal and its lineage edges (one transaction).

        ``candidate_id`` overrides the content hash (used for rejected attempts, whose
        files are not a valid program).
        """
        now = _now()
        cid = candidate_id or proposal.id
        with self.transaction():
            self.conn.execute(
                "INSERT INTO candidates (id, seq, files, norm_hash, operator, model, description, prompt_hash, "
                "island, status, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    cid,
                    seq,
                    _dumps(dict(proposal.files)),
                    norm_hash,
                    proposal.operator,
                    proposal.model,
                    proposal.description,
                    proposal.prompt_hash,
                    proposal.island,
                    status.value,
                    now,
                    now,
                ),
            )
            self.conn.executemany(
                "INSERT OR IGNORE INTO edges (child, parent, role, created_at) VALUES (?,?,?,?)",
                [(cid, parent, role.value, now) for parent, role in proposal.parents],
            )
        return Candidate(
            id=cid,
            seq=seq,
            files=proposal.files,
            operator=proposal.operator,
            model=proposal.model,
            description=proposal.description,
            prompt_hash=proposal.prompt_hash,
            island=proposal.island,
            status=status,
            parents=proposal.parents,
        )

    def add_edge(self, child: str, parent: str, role: EdgeRole) -> None:
        self.conn.execute(
            "INSERT OR IGNORE INTO edges (child, parent, role, created_at) VALUES (?,?,?,?)",
            (child, parent, role.value, _now()),
        )

    def set_status(self, candidate_id: str, status: CandidateStatus) -> None:
        self.conn.execute(
            "UPDATE candidates SET status=?, updated_at=? WHERE id=?",
            (status.value, _now(), candidate_id),
        )

    def candidate(self, candidate_id: str) -> Candidate:
        row = self.conn.execute(
            "SELECT id, seq, files, operator, model, description, prompt_hash, island, status "
            "FROM candidates WHERE id=?",
            (candidate_id,),
        ).fetchone()
        if row is None:
            raise KeyError(candidate_id)
        parents = tuple(
            (parent, EdgeRole(role))
            for parent, role in self.conn.execute(
                "SELECT parent, role FROM edges WHERE child=? ORDER BY rowid", (candidate_id,)
            )
        )
        return Candidate(
            id=row[0],
            seq=row[1],
            files=json.loads(row[2]),
            operator=row[3],
            model=row[4],
            description=row[5] or "",
            prompt_hash=row[6],
            island=row[7],
            status=CandidateStatus(row[8]),
            parents=parents,
        )

    def pending(self) -> list[Candidate]:
        """Candidates proposed or under evaluation when the last run stopped, in proposal order."""
        ids = [
            r[0]
            for r in self.conn.execute(
                "SELECT id FROM candidates WHERE status IN (?, ?) ORDER BY seq",
                (CandidateStatus.PROPOSED.value, CandidateStatus.EVALUATING.value),
            )
        ]
        return [self.candidate(cid) for cid in ids]

    def count(self, status: CandidateStatus | None = None) -> int:
        if status is None:
            return int(self.conn.execute("SELECT COUNT(*) FROM candidates").fetchone()[0])
        return int(
            self.conn.execute(
                "SELECT COUNT(*) FROM candidates WHERE status=?", (status.value,)
            ).fetchone()[0]
        )

    # --- evaluations --------------------------------------------------------------------

    def add_evaluation(self, candidate_id: str, evaluation: Evaluation) -> None:
        self.conn.execute(
            "INSERT INTO evaluations (candidate, stage, status, fitness, metrics, descriptors, artifacts, wall_s, "
            "seeds, hardware, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                candidate_id,
                evaluation.stage,
                evaluation.status.value,
                evaluation.fitness,
                _dumps(dict(evaluation.metrics)),
                _dumps(dict(evaluation.descriptors)),
                _dumps(dict(evaluation.artifacts)),
                evaluation.wall_s,
                _dumps(list(evaluation.seeds)),
                evaluation.hardware,
                _now(),
            ),
        )

    def evaluation(self, candidate_id: str) -> Evaluation | None:
        """The latest evaluation of a candidate, or None."""
        row = self.conn.execute(
            f"SELECT {_EVALUATION_COLUMNS} FROM evaluations WHERE candidate=? ORDER BY id DESC LIMIT 1",
            (candidate_id,),
        ).fetchone()
        return None if row is None else _evaluation_of(row)

    def seed_evaluation(self) -> Evaluation | None:
        """The latest evaluation of the seed program (the candidate with seq 0), or None."""
        seed = self.seed_candidate()
        return None if seed is None else self.evaluation(seed.id)

    def evaluations_at(self, candidate_id: str, stage: str) -> list[Evaluation]:
        """A candidate's evaluations of one ``stage``, oldest first."""
        rows = self.conn.execute(
            f"SELECT {_EVALUATION_COLUMNS} FROM evaluations WHERE candidate=? AND stage=? ORDER BY id",
            (candidate_id, stage),
        ).fetchall()
        return [_evaluation_of(row) for row in rows]

    def add_audit(
        self,
        candidate_id: str,
        *,
        flags: Sequence[Mapping[str, Any]],
        unparsed: Sequence[str],
        decision: str,
        reason: str = "",
        strict_fitness: float | None = None,
        review: Mapping[str, str] | None = None,
    ) -> None:
        """Record the auditor's verdict on a candidate (replacing one from an interrupted run).

        ``review``: the model's review (verdict, reasons, model, prompt_hash); None: none. The
        reasons, a model's answer, are capped as every stored answer is (``cap_answer``).
        A ``suspicious`` review flags the candidate like a static flag.
        """
        review = review or {}
        self.conn.execute(
            "INSERT OR REPLACE INTO audits (candidate, flagged, flags, unparsed, decision, reason, "
            "strict_fitness, created_at, review_verdict, review, review_model, review_prompt_hash) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                candidate_id,
                int(bool(flags) or review.get("verdict") == "suspicious"),
                _dumps([dict(f) for f in flags]),
                _dumps(list(unparsed)),
                decision,
                reason,
                strict_fitness,
                _now(),
                review.get("verdict"),
                None if review.get("reasons") is None else cap_answer(str(review["reasons"])),
                review.get("model"),
                review.get("prompt_hash"),
            ),
        )

    # --- elites, stats, state -------------------------------------------------------------

    def put_elite(self, island: int, cell: str, candidate_id: str, objective: float) -> None:
        self.conn.execute(
            "INSERT INTO elites (island, cell, candidate, objective, updated_at) VALUES (?,?,?,?,?) "
            "ON CONFLICT(island, cell) DO UPDATE SET candidate=excluded.candidate, "
            "objective=excluded.objective, updated_at=excluded.updated_at",
            (island, cell, candidate_id, objective, _now()),
        )

    def elites(self) -> list[tuple[int, str, str, float]]:
        """All (island, cell, candidate, objective) rows."""
        return [
            tuple(r)
            for r in self.conn.execute("SELECT island, cell, candidate, objective FROM elites")
        ]

    def add_stats(self, **row: float) -> None:
        columns = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        self.conn.execute(
            f"INSERT INTO stats ({columns}, created_at) VALUES ({marks}, ?)",
            (*row.values(), _now()),
        )

    def get_state(self, key: str, default: Any = None) -> Any:
        row = self.conn.execute("SELECT value FROM state WHERE key=?", (key,)).fetchone()
        return default if row is None else json.loads(row[0])

    def set_state(self, key: str, value: Any) -> None:
        self.conn.execute(
            "INSERT INTO state (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            (key, _dumps(value)),
        )

    # --- the schedule (evolve.search.engine records it, evolve.search.driver replays it) --------------------

    def record_ask(self, seq: int, ask: Mapping[str, Any], event: int) -> None:
        """Store (or replace, after a varied retry) proposal ``seq``'s request, issued at ``event``."""
        self.conn.execute(
            "INSERT INTO schedule (seq, ask, asked) VALUES (?,?,?) ON CONFLICT(seq) DO UPDATE "
            "SET ask=excluded.ask",
            (seq, _dumps(ask), event),
        )

    def mark_event(self, seq: int, column: str, event: int) -> None:
        """Note that proposal ``seq`` was ``admitted`` (its answer checked) or ``told`` at ``event``."""
        assert column in ("admitted", "told"), column
        self.conn.execute(f"UPDATE schedule SET {column}=? WHERE seq=?", (event, seq))

    def open_asks(self) -> list[dict[str, Any]]:
        """Requests issued but never answered (the run stopped with them in flight), by seq."""
        rows = self.conn.execute(
            "SELECT s.ask FROM schedule s LEFT JOIN candidates c ON c.seq = s.seq "
            "WHERE c.seq IS NULL ORDER BY s.seq"
        )
        return [json.loads(row[0]) for row in rows]

    def schedule(self) -> list[tuple[int, int | None, int | None, int | None]]:
        """(seq, asked, admitted, told) event numbers of every recorded proposal, by seq."""
        return [
            tuple(row)
            for row in self.conn.execute(
                "SELECT seq, asked, admitted, told FROM schedule ORDER BY seq"
            )
        ]

    def events(self) -> list[tuple[int, str, int]]:
        """(event, kind, seq) of the schedule in the order they happened; kind: ask, admit or tell."""
        events = []
        for seq, asked, admitted, told in self.schedule():
            events.append((asked, "ask", seq))
            if admitted is not None:
                events.append((admitted, "admit", seq))
            if told is not None and told != admitted:  # a rejection is told when it is admitted
                events.append((told, "tell", seq))
        return sorted(events)

    def last_event(self) -> int:
        """The highest event number recorded (-1 when none)."""
        row = self.conn.execute(
            "SELECT MAX(MAX(COALESCE(asked, -1)), MAX(COALESCE(admitted, -1)), "
            "MAX(COALESCE(told, -1))) FROM schedule"
        ).fetchone()
        return -1 if row[0] is None else int(row[0])

    # --- the research notebook (evolve.research.notebook writes it, evolve.query.notebook reads it) -----

    def put_note(
        self,
        seq: int,
        kind: str,
        text: str,
        *,
        model: str | None = None,
        prompt_hash: str | None = None,
    ) -> None:
        """Store a notebook version (``notes``) or a model's summary (``summary``) made at ``seq``
        (a summary, a model's answer, capped as every stored answer is: ``cap_answer``; a
        version packed against a recent one: ``PromptPacker``, read by ``query.notebook``)."""
        if kind == "summary":
            text = cap_answer(text)
        packed = base = None
        if kind == "notes":
            if self.conn.execute(
                "SELECT 1 FROM notebook WHERE base = ? LIMIT 1", (seq,)
            ).fetchone():
                raise EvolveError(
                    f"notebook version {seq} primes the versions after it and cannot be replaced: "
                    "record notebook versions in the order of their proposals"
                )
            if self.conn.execute(
                "SELECT 1 FROM notebook WHERE seq = ? AND kind = 'notes'", (seq,)
            ).fetchone():
                self._note_packer = PromptPacker(NOTE_BASE_USES)  # it may be the base held now
            packed, base = self._note_packer.pack(seq, text)
        self.conn.execute(
            "INSERT OR REPLACE INTO notebook "
            "(seq, kind, text, packed, base, chars, model, prompt_hash, created_at) "
            "VALUES (?,?,?,?,?,?,?,?,?)",
            (
                seq,
                kind,
                None if packed is not None else text,
                packed,
                base,
                len(text),
                model,
                prompt_hash,
                _now(),
            ),
        )

    # --- integrity -------------------------------------------------------------------------

    def integrity_problems(self) -> list[str]:
        """Everything that breaks the archive's invariants; empty when it is whole."""
        problems = [r[0] for r in self.conn.execute("PRAGMA integrity_check") if r[0] != "ok"]
        checks = {
            "elite that is not a done candidate": (
                "SELECT e.candidate FROM elites e LEFT JOIN candidates c ON c.id = e.candidate "
                "WHERE c.id IS NULL OR c.status != 'done'"
            ),
            "edge whose child is missing": (
                "SELECT e.child FROM edges e LEFT JOIN candidates c ON c.id = e.child WHERE c.id IS NULL"
            ),
            "edge whose parent is missing": (
                "SELECT e.parent FROM edges e LEFT JOIN candidates c ON c.id = e.parent WHERE c.id IS NULL"
            ),
            "done candidate without an evaluation": (
                "SELECT c.id FROM candidates c WHERE c.status IN ('done', 'failed') AND NOT EXISTS "
                "(SELECT 1 FROM evaluations v WHERE v.candidate = c.id)"
            ),
            "candidate evaluated twice": (
                "SELECT candidate FROM evaluations WHERE stage NOT IN ('reevaluation', 'strict') "
                "GROUP BY candidate "
                "HAVING COUNT(*) > 1"
            ),
        }
        for label, sql in checks.items():
            problems += [f"{label}: {row[0]}" for row in self.conn.execute(sql)]
        return problems


_EVALUATION_COLUMNS = (
    "status, fitness, metrics, descriptors, artifacts, stage, wall_s, seeds, hardware"
)


def _evaluation_of(row: Sequence[Any]) -> Evaluation:
    """An ``Evaluation`` from a row of ``_EVALUATION_COLUMNS``."""
    return Evaluation(
        status=EvalStatus(row[0]),
        fitness=row[1],
        metrics=json.loads(row[2]),
        descriptors=json.loads(row[3]),
        artifacts=json.loads(row[4]),
        stage=row[5],
        wall_s=row[6],
        seeds=tuple(json.loads(row[7])),
        hardware=row[8] or "",
    )
