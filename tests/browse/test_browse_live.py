"""Browsing a run while it is still writing (WAL): readers see new candidates and never block the writer."""

from __future__ import annotations

import json
import shutil
import time

from evolve.browse.source import open_run


def test_cli_sees_new_candidates_of_a_live_run(run_dir, tmp_path, browse, start_writer):
    shutil.copy(run_dir / "archive.db", tmp_path / "archive.db")
    before = json.loads(browse("stats", "--json", run=tmp_path).stdout)["run"]["candidates"]
    reader = open_run(tmp_path)  # opened before the writer starts, kept open throughout
    writer = start_writer(tmp_path / "archive.db", 8)
    seen, ids = [], []
    for line in writer.stdout:
        ids.append(line.strip())
        seen.append(reader.conn.execute("SELECT COUNT(*) FROM candidates").fetchone()[0])
        shown = json.loads(browse("show", ids[-1][:10], "--json", run=tmp_path).stdout)
        assert shown["id"] == ids[-1] and shown["status"] == "done"
        assert (
            json.loads(browse("best", "-k", "1", "--json", run=tmp_path).stdout)[0]["id"] == ids[-1]
        )
    assert writer.wait(timeout=60) == 0  # never blocked by the readers
    assert len(ids) == 8 and seen == sorted(seen) and seen[-1] == before + 8
    assert (
        json.loads(browse("stats", "--json", run=tmp_path).stdout)["run"]["candidates"]
        == before + 8
    )
    reader.close()


def test_reading_during_a_long_write_transaction_sees_the_last_commit(run_dir, tmp_path, browse):
    from evolve.store.database import Store

    shutil.copy(run_dir / "archive.db", tmp_path / "archive.db")
    writer = Store(tmp_path / "archive.db")
    count = writer.count()
    writer.conn.execute("BEGIN IMMEDIATE")
    writer.conn.execute("UPDATE runs SET reason='in flight'")
    started = time.perf_counter()
    result = browse(
        "stats", "--json", run=tmp_path
    )  # a writer holding the lock does not stall readers
    assert result.exit_code == 0 and time.perf_counter() - started < 5
    assert json.loads(result.stdout)["run"]["candidates"] == count
    writer.conn.execute("ROLLBACK")
    writer.close()
