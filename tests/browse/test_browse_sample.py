"""The synthetic archive writer and the big-archive script produce whole, realistic archives."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from evolve.store.database import Store
from tests.fixtures.sample_archive import write_sample_archive

SCRIPT = Path(__file__).parents[2] / "scripts" / "make_big_archive.py"


def test_sample_archive_is_whole_and_deterministic(tmp_path):
    a = write_sample_archive(tmp_path / "a.db", candidates=150, islands=3, seed=3)
    b = write_sample_archive(tmp_path / "b.db", candidates=150, islands=3, seed=3)
    sa, sb = Store(a, readonly=True), Store(b, readonly=True)
    assert sa.integrity_problems() == []
    ids = [r[0] for r in sa.conn.execute("SELECT id FROM candidates ORDER BY seq")]
    assert ids == [r[0] for r in sb.conn.execute("SELECT id FROM candidates ORDER BY seq")]
    statuses = dict(
        sa.conn.execute("SELECT status, COUNT(*) FROM candidates GROUP BY status").fetchall()
    )
    assert statuses.keys() == {"done", "failed", "rejected"} and len(ids) == 150
    roles = {r[0] for r in sa.conn.execute("SELECT DISTINCT role FROM edges")}
    assert {"mutation", "crossover", "inspiration"} <= roles
    assert {r[0] for r in sa.conn.execute("SELECT DISTINCT island FROM elites")} == {0, 1, 2}
    with pytest.raises(FileExistsError):
        write_sample_archive(a, candidates=1)


def test_big_archive_script_at_small_size(tmp_path):
    out = tmp_path / "run" / "archive.db"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--candidates", "300"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "300 candidates" in result.stdout and "integrity: ok" in result.stdout
    again = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True
    )
    assert again.returncode == 2 and "exists" in again.stderr
