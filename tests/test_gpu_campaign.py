"""scripts/gpu_campaign.py: every GPU-marked test file in exactly one shard, each within its limit;
a run's archive brought back whole; a command's output logged as it comes."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sqlite3
import subprocess
import sys
import time

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


def test_a_commands_lines_reach_the_log_while_it_runs_and_a_cut_command_keeps_them(tmp_path):
    module = campaign()
    command = (sys.executable, "-c", "import time; print('first test passed'); time.sleep(600)")
    log_path = tmp_path / "part.log"
    with log_path.open("w") as log:
        running = module.start(command, tmp_path / "scratch", log)
        while "first test passed" not in log_path.read_text():  # written while it still runs
            assert running.proc.poll() is None, "the command ended before its line was logged"
            time.sleep(0.1)
        record = module.finish(running, deadline=0.0)  # the part's limit has passed: cut
    assert record["timed_out"] and record["tail"] == ["first test passed"]


def test_a_command_sees_the_campaigns_variables_whatever_the_machine_set(tmp_path, monkeypatch):
    """The device image sets TIKTOKEN_CACHE_DIR to its own folder: the campaign's value wins,
    and variables that would point a command at other data are not passed on (issue 48)."""
    module = campaign()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "/image/tiktoken")
    monkeypatch.setenv("EVOLVE_SPEEDRUN_1GPU_DATA", "/elsewhere")
    show = "import json, os; print(json.dumps({k: os.environ.get(k) for k in ('TIKTOKEN_CACHE_DIR', 'EVOLVE_SPEEDRUN_1GPU_DATA')}))"  # fmt: skip
    with (tmp_path / "part.log").open("w") as log:
        record = module.finish(module.start((sys.executable, "-c", show), tmp_path / "s", log), deadline=time.monotonic() + 60)  # fmt: skip
    seen = json.loads(record["tail"][-1])
    assert seen == {"TIKTOKEN_CACHE_DIR": str(REPO / "data" / "tiktoken"), "EVOLVE_SPEEDRUN_1GPU_DATA": None}  # fmt: skip


def test_a_part_reports_its_commands_json_and_brings_back_their_text_logs(tmp_path, monkeypatch):
    module = campaign()
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("OUT", str(out))
    writes = (
        "import json, os, pathlib; here = pathlib.Path(os.environ['OUT']); "
        "(here / 'logs').mkdir(); (here / 'logs' / 'seed-0.txt').write_text('step 0 loss 11'); "
        "(here / 'result.json').write_text(json.dumps({'loss': 5.08})); print('ran')"
    )
    part = module.Part(("speedrun",), "a measurement", ((sys.executable, "-c", writes),))
    assert module.run_part("measure", part, out) == 0
    report = json.loads((out / "measure.json").read_text())
    assert report["runs"][0]["results"] == {"result.json": {"loss": 5.08}}
    assert report["runs"][0]["tail"] == ["ran"]
    logs = (out / "measure-logs.txt").read_text()
    assert logs == "==> command 0: logs/seed-0.txt <==\nstep 0 loss 11"
    assert sorted(p.name for p in out.iterdir()) == [  # flat: what the device brings back
        "measure-logs.txt", "measure.json", "measure.log", "measure.md"]  # fmt: skip
