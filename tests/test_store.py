import sqlite3

import pytest

from evolve.store import SCHEMA_VERSION, ArchiveFileError, Store
from evolve.types import CandidateStatus, EdgeRole, EvalStatus, Evaluation, Proposal


def test_new_archive_gets_the_current_schema_in_wal_mode(tmp_path):
    store = Store(tmp_path / "archive.db")
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert {"runs", "candidates", "evaluations", "edges", "elites", "llm_calls", "stats", "state"} <= set(
        store.db.table_names()
    )


def test_candidate_round_trip_with_edges_and_evaluation(tmp_path):
    store = Store(tmp_path / "archive.db")
    parent = store.add_candidate(Proposal(files={"a.py": "x = 1\n"}, operator="seed"), seq=0)
    child = store.add_candidate(
        Proposal(files={"a.py": "x = 2\n"}, operator="tweak", parents=((parent.id, EdgeRole.MUTATION),)), seq=1
    )
    with store.transaction():
        store.set_status(child.id, CandidateStatus.DONE)
        store.add_evaluation(child.id, Evaluation(status=EvalStatus.OK, fitness=2.0, metrics={"m": 1}))
    loaded = store.candidate(child.id)
    assert loaded.files == {"a.py": "x = 2\n"} and loaded.parents == ((parent.id, EdgeRole.MUTATION),)
    assert store.evaluation(child.id).fitness == 2.0
    assert [c.id for c in store.pending()] == [parent.id]


def test_a_failed_transaction_leaves_nothing_behind(tmp_path):
    store = Store(tmp_path / "archive.db")
    with pytest.raises(RuntimeError), store.transaction():
        store.set_state("k", 1)
        raise RuntimeError("boom")
    assert store.get_state("k") is None


def test_integrity_problems_finds_dangling_edges_and_bad_elites(tmp_path):
    store = Store(tmp_path / "archive.db")
    seed = store.add_candidate(Proposal(files={"a": "1"}, operator="seed"), seq=0)
    assert store.integrity_problems() == []
    with store.transaction():
        store.add_edge(seed.id, "missing-parent", EdgeRole.MUTATION)
        store.put_elite(0, "0", seed.id, 1.0)  # seed is only proposed, not done
    problems = store.integrity_problems()
    assert any("parent is missing" in p for p in problems)
    assert any("elite that is not a done candidate" in p for p in problems)


def test_foreign_sqlite_file_is_refused_with_a_fix(tmp_path):
    path = tmp_path / "archive.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE other (x)")
    conn.commit()
    conn.close()
    with pytest.raises(ArchiveFileError, match="not an evolve archive"):
        Store(path)


def test_corrupt_file_is_refused_with_a_fix(tmp_path):
    path = tmp_path / "archive.db"
    path.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(ArchiveFileError, match="not a readable SQLite archive"):
        Store(path)


def test_readonly_open_of_a_missing_archive_names_the_fix(tmp_path):
    with pytest.raises(ArchiveFileError, match="pass a run directory"):
        Store(tmp_path / "nope.db", readonly=True)


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "archive.db"
    Store(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(ArchiveFileError, match="upgrade evolve"):
        Store(path)
