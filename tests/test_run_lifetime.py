"""Nothing a run starts outlives it: after a SIGKILL of the run (its own process only, as an
out-of-memory killer or a user's ``kill -9`` would), the resume ends what it left running,
records the calls it had in flight ``lost`` and its session ``killed``."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import REPO

SCRIPTED = f"{REPO / 'tests' / 'fixtures' / 'scripted_model.py'} --seed 0"
HANG = REPO / "tests" / "fixtures" / "hanging_command.py"


def marked(mark: str) -> set[int]:
    """Live processes (zombies aside) whose environment carries ``TEST_MARK=mark``."""
    needle = f"TEST_MARK={mark}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in environ and state != "Z":
            found.add(int(entry.name))
    return found


def evolve(args: list[str], mark: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TEST_MARK": mark, "HYDRA_FULL_ERROR": "0"}
    return subprocess.Popen(
        [sys.executable, "-m", "evolve", *args], cwd=REPO, env=env, text=True, **popen
    )


def wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, "the run ended before it hung"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


HUNG_FITNESS = [
    "--config-dir",
    "tests/fixtures/evolve_configs",
    "benchmark=toy",
    "benchmark.fitness._target_=tests.fixtures.toy.HangsWhile",
    "search.workers=2",
    "search.max_candidates=6",
    "search.progress=false",
]
CALL_IN_FLIGHT = [
    "llm=command",
    "operators.builtin.tweak=0",
    "operators.builtin.crossover=0",
    "search.workers=1",
    "search.max_candidates=3",
    "emitter.selection=weights",
    "archive.islands=1",
    "search.progress=false",
]


@pytest.mark.parametrize("case", ["hung fitness", "provider call in flight"])
def test_a_run_killed_by_sigkill_leaves_nothing_running_past_its_resume(tmp_path, case) -> None:
    flag, mark, run_dir = tmp_path / "hang.flag", uuid.uuid4().hex, tmp_path / "run"
    flag.write_text("hang")
    if case == "hung fitness":
        args = [*HUNG_FITNESS, f"+benchmark.fitness.flag={flag}"]
    else:
        args = [
            *CALL_IN_FLIGHT,
            f"llm.command={sys.executable} {HANG} {flag} {sys.executable} {SCRIPTED}",
        ]
    first = evolve(
        [*args, f"hydra.run.dir={run_dir}"],
        mark,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(flag.with_suffix(".seen"), first)
        time.sleep(0.5)  # the hung process's helpers are started
        assert len(marked(mark)) >= 2  # the run and what it started
        os.kill(
            first.pid, signal.SIGKILL
        )  # the run's own process only: its children are not signalled
        first.wait()
    finally:
        if first.poll() is None:
            first.kill()
    flag.unlink()
    resumed = evolve([f"resume={run_dir}"], mark, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output, _ = resumed.communicate(timeout=600)
    try:
        assert resumed.returncode == 0, output
        assert marked(mark) == set(), "a process of the killed run outlived the resume"
    finally:
        for pid in marked(mark):
            os.kill(pid, signal.SIGKILL)
    with sqlite3.connect(run_dir / "archive.db") as db:
        statuses = [row[0] for row in db.execute("SELECT status FROM runs ORDER BY id")]
        lost = db.execute("SELECT COUNT(*) FROM llm_calls WHERE status='lost'").fetchone()[0]
    assert statuses == ["killed", "finished"]
    assert lost == (1 if case == "provider call in flight" else 0)
