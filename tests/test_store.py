import json
import sqlite3

import pytest

from evolve.store.database import ArchiveFileError, Store
from evolve.store.schema import SCHEMA_VERSION
from evolve.types import CandidateStatus, EdgeRole, EvalStatus, Evaluation, Proposal


def test_new_archive_gets_the_current_schema_in_wal_mode(tmp_path):
    store = Store(tmp_path / "archive.db")
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert {
        "runs",
        "candidates",
        "evaluations",
        "edges",
        "elites",
        "llm_calls",
        "stats",
        "state",
    } <= set(store.db.table_names())


def test_candidate_round_trip_with_edges_and_evaluation(tmp_path):
    store = Store(tmp_path / "archive.db")
    parent = store.add_candidate(Proposal(files={"a.py": "x = 1\n"}, operator="seed"), seq=0)
    child = store.add_candidate(
        Proposal(
            files={"a.py": "x = 2\n"}, operator="tweak", parents=((parent.id, EdgeRole.MUTATION),)
        ),
        seq=1,
    )
    with store.transaction():
        store.set_status(child.id, CandidateStatus.DONE)
        store.add_evaluation(
            child.id, Evaluation(status=EvalStatus.OK, fitness=2.0, metrics={"m": 1})
        )
    loaded = store.candidate(child.id)
    assert loaded.files == {"a.py": "x = 2\n"} and loaded.parents == (
        (parent.id, EdgeRole.MUTATION),
    )
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


def test_readonly_open_of_an_empty_sqlite_file_says_it_is_no_archive(tmp_path):
    path = tmp_path / "archive.db"
    sqlite3.connect(path).close()
    with pytest.raises(ArchiveFileError, match="empty SQLite file, not an archive"):
        Store(path, readonly=True)


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "archive.db"
    Store(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(ArchiveFileError, match="upgrade evolve"):
        Store(path)


def _schema_2_archive(path, calls):
    """An archive as evolve wrote it before schema 3: prompts as JSON text, answers whole."""
    import sqlite_utils

    from evolve.store.schema import APPLICATION_ID, MIGRATIONS

    conn = sqlite3.connect(path, isolation_level=None)
    db = sqlite_utils.Database(conn)
    for migration in MIGRATIONS[:2]:
        migration(db)
    conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
    conn.execute("PRAGMA user_version=2")
    for key, messages, response, error in calls:
        conn.execute(
            "INSERT INTO llm_calls (model, prompt_hash, cache_key, messages, response, tokens_in, tokens_out, "
            "cost, latency_s, error, created_at) VALUES ('m/x', 'p', ?, ?, ?, 1, 1, 0.001, 0.1, ?, 0)",
            (key, json.dumps(messages), response, error),
        )
    conn.close()


def test_an_old_archive_is_migrated_prompts_compressed_answers_capped(tmp_path):
    from evolve.store.calls import prompt_messages

    huge = "start " + "y" * 2_000_000 + " end"
    prompts = [
        [{"role": "user", "content": f"program {i}\n" + "def f(x):\n    return x\n" * 50}]
        for i in range(3)
    ]
    calls = [
        ("k0", prompts[0], "short answer", None),
        ("k1", prompts[1], None, "RateLimitError: slow down"),
        ("k2", prompts[2], huge, None),
    ]
    _schema_2_archive(tmp_path / "archive.db", calls)
    store = Store(tmp_path / "archive.db")
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    columns = {row[1] for row in store.conn.execute("PRAGMA table_info(llm_calls)")}
    assert (
        "messages" not in columns and {"prompt", "prompt_base", "status", "answer_chars"} <= columns
    )
    rows = store.conn.execute(
        "SELECT id, status, response, answer_chars, prompt_base FROM llm_calls ORDER BY id"
    )
    (a, b, c) = rows.fetchall()
    assert [prompt_messages(store.conn, row[0]) for row in (a, b, c)] == prompts
    assert (a[1], a[2], a[3], a[4]) == (
        "ok",
        "short answer",
        12,
        None,
    )  # the first prompt is the base
    assert (b[1], b[2], c[4]) == ("error", None, a[0])  # later ones are compressed against it
    assert (
        c[3] == len(huge)
        and len(c[2]) < 210_000
        and c[2].startswith("start ")
        and c[2].endswith(" end")
    )
    stored = store.conn.execute("SELECT SUM(LENGTH(prompt)) FROM llm_calls").fetchone()[0]
    assert stored < sum(len(json.dumps(p)) for p in prompts) / 4


def test_answers_of_an_old_archive_replay_from_it_unmigrated(tmp_path):
    import asyncio

    from evolve.llm import LLMClient, LLMSettings
    from evolve.llm.ledger import cache_key

    settings = LLMSettings.from_config(
        {"model": "m/x", "offline": True, "replay_from": str(tmp_path / "old.db")}
    )
    messages = [{"role": "user", "content": "go"}]
    key = cache_key("m/x", messages, settings.sampling(), 0)
    _schema_2_archive(tmp_path / "old.db", [(key, messages, "recorded answer", None)])
    client = LLMClient(settings, store=Store(tmp_path / "new.db"))
    answer = asyncio.run(client.complete("m/x", messages, sample=0, prompt_hash="p"))
    assert answer.text == "recorded answer" and answer.cached
    assert sqlite3.connect(tmp_path / "old.db").execute("PRAGMA user_version").fetchone()[0] == 2


def test_a_damaged_archive_is_one_error_naming_recover_and_is_never_written_to(tmp_path):
    path = tmp_path / "archive.db"
    store = Store(path)
    store.start_run(config={"a": 1}, harness_hash="h", seed=0, hardware="x")
    for seq in range(200):  # pages enough that junk in the middle hits table pages
        store.add_candidate(Proposal(files={"a.py": f"x = {seq}\n" * 50}, operator="seed"), seq=seq)
    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    data = bytearray(path.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 8192] = b"\xff\xfe" * 4096
    path.write_bytes(bytes(data))
    with pytest.raises(ArchiveFileError, match=r"\.recover"):
        Store(path)  # a run, or its resume, opening it to write
    assert path.read_bytes() == bytes(data)
    assert not path.with_name("archive.db-wal").exists()


def test_review_and_summary_answers_are_capped_like_every_stored_answer(tmp_path):
    from evolve.store.calls import ANSWER_HEAD_CHARS, ANSWER_TAIL_CHARS

    store = Store(tmp_path / "archive.db")
    candidate = store.add_candidate(Proposal(files={"a.py": "x = 1\n"}, operator="seed"), seq=0)
    huge = "r" * 10_000_000
    store.add_audit(
        candidate.id,
        flags=[],
        unparsed=[],
        decision="kept",
        review={"verdict": "ok", "reasons": huge},
    )
    store.put_note(1, "summary", huge, model="m")
    cap = ANSWER_HEAD_CHARS + ANSWER_TAIL_CHARS + 200
    (review,) = store.conn.execute("SELECT LENGTH(review) FROM audits").fetchone()
    (summary,) = store.conn.execute("SELECT LENGTH(text) FROM notebook").fetchone()
    assert review < cap and summary < cap


def test_a_killed_session_reads_killed_and_its_calls_in_flight_lost(tmp_path):
    store = Store(tmp_path / "archive.db")
    store.start_run(config={}, harness_hash="h", seed=0, hardware="x")
    store.conn.execute(
        "INSERT INTO llm_calls (model, prompt_hash, cache_key, status, created_at) "
        "VALUES ('m', 'p', 'k', 'pending', 0)"
    )
    assert store.end_dead_sessions() == (1, 1)
    assert store.latest_run()["status"] == "killed"
    (status, error) = store.conn.execute("SELECT status, error FROM llm_calls").fetchone()
    assert status == "lost" and "killed" in error


def _notebook_versions(count: int) -> list[str]:
    """``count`` notebook texts that drift as a run's does: a tally, the last 20 tries, effects."""
    versions = []
    for seq in range(count):
        recent = "\n".join(
            f"- proposal {s}: tweak of candidate {s * 7 % 53} changed radius {s % 9} by "
            f"{(s * 37 % 101) / 1000:.3f}, scored {(s * 13 % 97) / 97:.4f}"
            for s in range(max(0, seq - 20), seq)
        )
        effects = "\n".join(
            f"- changing constant {k} moved the score by {k * 0.0123:.4f} ({seq // (k + 3)} tries)"
            for k in range(8)
        )
        versions.append(
            f"### The run so far\n\n{seq} proposals ({seq * 3 // 4} done, {seq // 4} failed); "
            "repeated evaluations of one program vary by sd 0.0021.\n\n"
            f"### Tried recently (newest last)\n\n{recent}\n\n"
            f"### Effects that hold (beyond noise; newest first)\n\n{effects}\n"
        )
    return versions


def test_notebook_versions_are_stored_packed_and_read_back_whole(tmp_path):
    from evolve.query.notebook import note_at, note_history

    store = Store(tmp_path / "a.db")
    versions = _notebook_versions(300)
    for seq, text in enumerate(versions):
        store.put_note(seq, "notes", text)
    assert [note_at(store, seq)["text"] for seq in range(300)] == versions
    assert [v["chars"] for v in note_history(store)] == [len(text) for text in versions]
    (stored, full) = store.conn.execute(
        "SELECT SUM(LENGTH(packed)) + COALESCE(SUM(LENGTH(text)), 0), SUM(chars) FROM notebook"
    ).fetchone()
    assert stored < 0.12 * full, (stored, full)  # measured 0.085 (each version zlib alone: 0.25)


def test_a_notebook_version_others_are_packed_against_is_not_replaced(tmp_path):
    from evolve.query.notebook import note_at
    from evolve.types import EvolveError

    store = Store(tmp_path / "a.db")
    store.put_note(0, "notes", "first")
    store.put_note(1, "notes", "second")
    store.put_note(1, "notes", "second, rewritten")  # nothing is packed against it yet
    store.put_note(2, "notes", "third")
    assert [note_at(store, seq)["text"] for seq in range(3)] == [
        "first",
        "second, rewritten",
        "third",
    ]
    with pytest.raises(EvolveError, match="in the order of their proposals"):
        store.put_note(1, "notes", "second, rewritten again")  # the third is packed against it
    assert note_at(store, 2)["text"] == "third"


def test_an_old_archive_s_notebook_is_migrated_to_packed_versions(tmp_path):
    import sqlite_utils

    from evolve.query.notebook import note_at, note_history
    from evolve.store.schema import APPLICATION_ID, MIGRATIONS

    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    db = sqlite_utils.Database(conn)
    for migration in MIGRATIONS[:7]:  # the schema before notebook versions were packed
        migration(db)
    conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
    conn.execute("PRAGMA user_version=7")
    versions = _notebook_versions(120)
    for seq, text in enumerate(versions):
        conn.execute(
            "INSERT INTO notebook (seq, kind, text, created_at) VALUES (?, 'notes', ?, 0)",
            (seq, text),
        )
    conn.execute(
        "INSERT INTO notebook (seq, kind, text, model, created_at) VALUES (5, 'summary', 'brief', 'm/x', 0)"
    )
    conn.close()
    store = Store(path)
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert [note_at(store, seq)["text"] for seq in range(120)] == versions
    assert note_at(store, 7, "summary") == {"seq": 5, "text": "brief", "model": "m/x"}
    assert {(v["seq"], v["kind"]): v["chars"] for v in note_history(store)} == {
        **{(seq, "notes"): len(text) for seq, text in enumerate(versions)},
        (5, "summary"): 5,
    }
    assert store.conn.execute(
        "SELECT COUNT(*) FROM notebook WHERE kind = 'notes' AND text IS NOT NULL"
    ).fetchone() == (0,)
    store.put_note(120, "notes", versions[-1] + "- one more\n")  # a resumed run packs on
    assert note_at(store, 120)["text"] == versions[-1] + "- one more\n"
