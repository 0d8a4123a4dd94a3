"""scripts/gpu_campaign.py: every GPU-marked test file in exactly one shard, each within its limit;
a run's archive brought back whole."""

from __future__ import annotations

import importlib.util
import os
import re
import sqlite3
import subprocess
import sys

from tests.conftest import REPO

GPU_MARK = re.compile(r"pytest\.mark\.gpu\b")


def campaign():
    spec = importlib.util.spec_from_file_location(
        "gpu_campaign", REPO / "scripts" / "gpu_campaign.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def gpu_marked_files() -> set[str]:
    """The test files that mark a test (or themselves) ``gpu``."""
    return {
        path.relative_to(REPO).as_posix()
        for path in (REPO / "tests").rglob("test_*.py")
        if GPU_MARK.search(path.read_text())
    }


def covers(entry: str, file: str) -> bool:
    return file == entry or file.startswith(entry.rstrip("/") + "/")


def test_every_gpu_marked_file_is_in_exactly_one_shard():
    shards = campaign().SHARDS
    files = gpu_marked_files()
    assert "tests/redteam/test_nanochat.py" in files  # the scan finds the marks
    for file in sorted(files):
        holders = [
            name for name, shard in shards.items() if any(covers(p, file) for p in shard.paths)
        ]
        assert len(holders) == 1, (
            f"{file} is in the shards {holders}: name it in exactly one of scripts/gpu_campaign.py's SHARDS"
        )


def test_every_shard_entry_exists_holds_gpu_tests_and_fits_the_limit():
    module = campaign()
    files = gpu_marked_files()
    for name, shard in module.SHARDS.items():
        assert shard.expected_s <= module.SHARD_LIMIT_S, (
            f"{name} is expected to take {shard.expected_s} s: split it"
        )
        for entry in shard.paths:
            assert (REPO / entry).exists(), f"{name} names {entry}, which does not exist"
            assert any(covers(entry, f) for f in files), (
                f"{name} names {entry}, which holds no GPU-marked test"
            )
        part = module.parts(0)[name]
        assert part.commands == (module.pytest(*shard.paths),)


def test_a_killed_runs_archive_comes_back_with_the_rows_still_in_its_write_ahead_log(tmp_path):
    run = sqlite3.connect(tmp_path / "archive.db")  # a writer still open: its rows are in the WAL
    run.execute("PRAGMA journal_mode=wal")
    run.execute("PRAGMA wal_autocheckpoint=0")
    run.execute("CREATE TABLE candidates (id TEXT)")
    run.executemany("INSERT INTO candidates VALUES (?)", [("a",), ("b",)])
    run.commit()
    out = tmp_path / "out"
    out.mkdir()
    command = campaign().keep(str(tmp_path / "archive.db"), "kept.db")
    subprocess.run(command, check=True, env={**os.environ, "CAMPAIGN_OUT": str(out)})
    assert sorted(p.name for p in out.iterdir()) == ["kept.db"]  # one file, no WAL beside it
    kept = sqlite3.connect(out / "kept.db").execute("SELECT id FROM candidates").fetchall()
    assert kept == [("a",), ("b",)]
    run.close()
