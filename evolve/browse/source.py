"""Opening a run's archive read-only and resolving candidate IDs given by the user."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from evolve.query.candidates import id_of_seq, ids_with_prefix
from evolve.query.run import best_candidate, max_seq
from evolve.store.database import ArchiveFileError, Store
from evolve.types import EvolveError


class BrowseError(EvolveError):
    """Bad input to the browser (unknown or ambiguous ID, bad path); the message names the fix."""


def archive_path(run: Path | str) -> Path:
    """The ``archive.db`` of ``run``, which may be a run directory or the file itself."""
    path = Path(run).expanduser()
    if path.is_dir():
        if (path / "archive.db").is_file():
            return path / "archive.db"
        raise BrowseError(
            f"{path} has no archive.db: pass a run directory (archives/<benchmark>/<time>/) "
            "or an archive.db file"
        )
    if not path.exists():
        raise BrowseError(f"{path} does not exist: pass a run directory or its archive.db")
    return path


def open_run(run: Path | str) -> Store:
    """Open a run's archive read-only (a live run's new rows stay visible: WAL).

    Raises:
        BrowseError: the path is not an evolve archive; the message says what to pass.
    """
    path = archive_path(run)
    try:
        return Store(path, readonly=True)
    except ArchiveFileError as exc:
        raise BrowseError(str(exc)) from None


def resolve_id(conn: sqlite3.Connection, given: str) -> str:
    """The full id of a candidate named by a unique id prefix, ``#SEQ`` or ``best``.

    Raises:
        BrowseError: no candidate or several match; the message lists what to try.
    """
    text = given.strip()
    if text.lower() == "best":
        best = best_candidate(conn)
        if best is None:
            raise BrowseError(
                "this archive has no elites yet, so there is no best: name a candidate by id prefix"
            )
        return best
    if text.startswith("#") and text[1:].isdigit():
        found = id_of_seq(conn, int(text[1:]))
        if found is None:
            raise BrowseError(
                f"no candidate with seq {text[1:]}: seqs run from #0 to #{max_seq(conn)}"
            )
        return found
    prefix = text.lower()
    rows = ids_with_prefix(conn, prefix, limit=6)
    if len(rows) == 1:
        return rows[0]
    if not rows:
        raise BrowseError(
            f"no candidate id starts with {given!r}: list some with the 'best' command, "
            "or use #SEQ or 'best'"
        )
    shown = ", ".join(r[: len(prefix) + 4] for r in rows[:5]) + (", ..." if len(rows) > 5 else "")
    raise BrowseError(f"id prefix {given!r} is ambiguous ({shown}): type more characters")
