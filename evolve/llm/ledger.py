"""The ``llm_calls`` table: every call recorded, recorded answers served again, money spent."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from evolve.store.calls import PromptPacker, cap_answer
from evolve.store.database import Store

Messages = Sequence[Mapping[str, Any]]


def _digest(payload: object) -> str:
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_key(model: str, messages: Messages, params: Mapping[str, Any], sample: str | int) -> str:
    """The identity of one request: model, sampling parameters and sample index, then the messages.

    The first 16 hex digits (the *request part*) do not depend on the messages, so an
    offline replay can still find the answer a proposal got when the prompt differs only
    in measured numbers (wall times) between the recorded run and the replay.
    """
    return request_part(model, params, sample) + _digest(list(messages))


def text_hash(text: str) -> str:
    """The hash an embedded text is recorded under (its ``prompt_hash``; the text is not stored)."""
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def request_part(model: str, params: Mapping[str, Any], sample: str | int) -> str:
    """The part of a cache key that names the proposal, not the prompt."""
    return _digest({"model": model, "params": dict(params), "sample": str(sample)})


@dataclass(frozen=True, kw_only=True)
class CallRecord:
    """One row of ``llm_calls`` (an attempt: successful or not; an embedding's ``response`` is its
    packed vector, see ``evolve.store.calls.pack_vector``)."""

    model: str
    prompt_hash: str
    cache_key: str
    messages: Messages
    response: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float | None = None
    latency_s: float = 0.0
    error: str | None = None
    # ok, error (the attempt failed), cancelled (ended by the run, charged what it used),
    # pending (in flight) or lost (in flight when its session was killed)
    status: str = "ok"
    candidate: str | None = None


@dataclass(frozen=True, kw_only=True)
class Recorded:
    """A recorded answer found for a cache key."""

    call_id: int
    response: str
    tokens_in: int
    tokens_out: int
    source: str  # "archive" or the path of the replay archive
    truncated: bool = False  # only the head and tail of a huge answer were stored


class Ledger:
    """Reads and writes a run's ``llm_calls`` (and reads a replay archive's, when given).

    Args:
        store: the run's store.
        replay_from: another ``archive.db`` whose answers may be served (opened read-only).
    """

    def __init__(self, store: Store, *, replay_from: str | Path | None = None) -> None:
        self.store = store
        self._packer = PromptPacker()
        self._replay: sqlite3.Connection | None = None
        self.replay_path = Path(replay_from) if replay_from else None
        if self.replay_path is not None:
            path = (
                self.replay_path / "archive.db" if self.replay_path.is_dir() else self.replay_path
            )
            if not path.is_file():
                from evolve.llm.errors import LLMStop

                raise LLMStop(
                    f"llm.replay_from={replay_from}: no archive there; give a run directory or its archive.db"
                )
            self.replay_path = path
            self._replay = sqlite3.connect(
                f"file:{path}?mode=ro", uri=True, check_same_thread=False
            )
        self._replay_chars = self._replay is not None and any(
            row[1] == "answer_chars" for row in self._replay.execute("PRAGMA table_info(llm_calls)")
        )

    def begin(self, call: CallRecord) -> int:
        """Record an attempt as it starts (``pending``: a session killed before it ends leaves it
        to be read ``lost``, see ``Store.end_dead_sessions``); returns its id for ``record``."""
        return self.record(replace(call, status="pending"))

    def record(self, call: CallRecord, *, row: int | None = None) -> int:
        """Insert one attempt, or complete the one ``begin`` started (``row``); returns its id
        (the prompt is stored compressed, the answer capped; an embedding has no messages and
        stores no prompt)."""
        values = (
            None if call.response is None else cap_answer(call.response),
            None if call.response is None else len(call.response),
            call.tokens_in,
            call.tokens_out,
            call.cost,
            round(call.latency_s, 4),
            call.error,
            call.status,
        )
        if row is not None:
            with self.store.transaction():
                self.store.conn.execute(
                    "UPDATE llm_calls SET response=?, answer_chars=?, tokens_in=?, tokens_out=?, "
                    "cost=?, latency_s=?, error=?, status=? WHERE id=?",
                    (*values, row),
                )
            return row
        prompt = json.dumps(list(call.messages), ensure_ascii=False, default=str)
        with self.store.transaction():
            cursor = self.store.conn.execute(
                "INSERT INTO llm_calls (candidate, model, prompt_hash, cache_key, response, answer_chars, "
                "tokens_in, tokens_out, cost, latency_s, error, status, created_at) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    call.candidate,
                    call.model,
                    call.prompt_hash,
                    call.cache_key,
                    *values,
                    time.time(),
                ),
            )
            call_id = int(cursor.lastrowid)
            if call.messages:
                blob, base = self._packer.pack(call_id, prompt)
                self.store.conn.execute(
                    "UPDATE llm_calls SET prompt=?, prompt_base=? WHERE id=?", (blob, base, call_id)
                )
        return call_id

    def lookup(self, key: str, *, same_request: bool = False) -> Recorded | None:
        """The first successful answer recorded for ``key``: in this archive, else the replay archive.

        With ``same_request`` (offline replay), an answer recorded for the same model,
        parameters and sample index but a different prompt also counts: measured numbers in
        the prompt differ from the recorded run's, and replaying a run means serving each
        proposal its recorded answer. Online, only the exact request matches, in either
        archive: a changed prompt gets a new call, never another prompt's answer.
        """
        sources = [(self.store.conn, "archive")]
        if self._replay is not None:
            sources.append((self._replay, str(self.replay_path)))
        for conn, source in sources:
            # an archive from before schema 3 (a replay source, opened read-only) has no answer_chars
            chars = "answer_chars" if conn is self.store.conn or self._replay_chars else "NULL"
            select = f"SELECT id, response, tokens_in, tokens_out, {chars} FROM llm_calls WHERE "
            ok = " AND error IS NULL AND response IS NOT NULL ORDER BY id LIMIT 1"
            queries = [(select + "cache_key=?" + ok, key)]
            if same_request:
                queries.append((select + "substr(cache_key, 1, 16)=?" + ok, key[:16]))
            for sql, arg in queries:
                row = conn.execute(sql, (arg,)).fetchone()
                if row is not None:
                    return Recorded(
                        call_id=row[0],
                        response=row[1],
                        tokens_in=row[2] or 0,
                        tokens_out=row[3] or 0,
                        source=source,
                        truncated=row[4] is not None and row[4] > len(row[1]),
                    )
        return None

    def close(self) -> None:
        """Close the replay archive, if one was opened."""
        if self._replay is not None:
            self._replay.close()
            self._replay = None

    def spent(self) -> float:
        """USD recorded in this archive (all runs, so a resumed run keeps counting)."""
        return float(
            self.store.conn.execute("SELECT COALESCE(SUM(cost), 0) FROM llm_calls").fetchone()[0]
        )

    def last_id(self) -> int:
        """The id of the newest row (0: none), to tell this session's calls from earlier ones."""
        return int(
            self.store.conn.execute("SELECT COALESCE(MAX(id), 0) FROM llm_calls").fetchone()[0]
        )

    def only_failures_since(self, since: int) -> str | None:
        """The last error, when every call after row ``since`` failed (and there was one); else None."""
        ok, failed, last = self.store.conn.execute(
            "SELECT SUM(status = 'ok'), SUM(status = 'error'), "
            "(SELECT error FROM llm_calls WHERE id > ? AND status = 'error' ORDER BY id DESC LIMIT 1) "
            "FROM llm_calls WHERE id > ?",
            (since, since),
        ).fetchone()
        return last if failed and not ok else None

    def answer_lengths(self) -> dict[str, tuple[int, int]]:
        """Per model: the answers recorded in this archive and their answer tokens in all."""
        rows = self.store.conn.execute(
            "SELECT model, COUNT(*), COALESCE(SUM(tokens_out), 0) FROM llm_calls "
            "WHERE status = 'ok' AND response IS NOT NULL GROUP BY model"
        ).fetchall()
        return {model: (count, tokens) for model, count, tokens in rows}

    def summary(self) -> dict[str, Any]:
        """Calls, failed calls (cancelled ones apart), tokens and USD per model."""
        rows = self.store.conn.execute(
            "SELECT model, COUNT(*), SUM(status = 'error'), SUM(status = 'cancelled'), COALESCE(SUM(tokens_in), 0), "
            "COALESCE(SUM(tokens_out), 0), COALESCE(SUM(cost), 0) FROM llm_calls GROUP BY model ORDER BY model"
        ).fetchall()
        return {
            model: {
                "calls": n,
                "errors": errors,
                "cancelled": cancelled,
                "tokens_in": tin,
                "tokens_out": tout,
                "cost": cost,
            }
            for model, n, errors, cancelled, tin, tout, cost in rows
        }
