"""``python -m evolve backend=ray`` against a real Ray head on 127.0.0.1: a search, and a worker killed."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from evolve.store.database import Store
from tests.backends.fitnesses import traces

REPO = Path(__file__).resolve().parents[2]
CONFIGS = "tests/backends/evolve_configs"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def session_processes(sid: int) -> list[int]:
    """Processes of session ``sid`` (the head and everything Ray started under it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getsid(int(entry.name)) == sid:
                    found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def ray_head():
    """A Ray head on 127.0.0.1 with 2 CPUs (``ray start --head --block``); yields (address, env)."""
    pytest.importorskip("ray")
    ray_cli = Path(sys.executable).with_name("ray")
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray puts unix sockets in it
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(PYTHONPATH=str(REPO), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    log = open(Path(temp_dir) / "head.log", "w")  # noqa: SIM115 - closed at teardown
    head = subprocess.Popen(
        [
            str(ray_cli),
            "start",
            "--head",
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            "--num-cpus=2",
            "--num-gpus=0",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={temp_dir}",
        ],  # fmt: skip
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            status = subprocess.run(
                [str(ray_cli), "status", f"--address={address}"], env=env, capture_output=True
            )
            if status.returncode == 0:
                break
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"the Ray head did not start: {(Path(temp_dir) / 'head.log').read_text()}"
                )
            time.sleep(1)
        yield address, env
    finally:
        for pid in session_processes(head.pid):  # everything this head started, by id
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        head.wait()
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def evolve_command(address: str, run_dir: Path, trace_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "evolve", "--config-dir", CONFIGS, "benchmark=traced",
        "backend=ray", f"backend.address={address}", "search.progress=false",
        f"hydra.run.dir={run_dir}", f"benchmark.fitness.trace_dir={trace_dir}", *extra,
    ]  # fmt: skip


def check_archive(run_dir: Path, budget: int) -> Store:
    """The run evaluated exactly ``budget`` candidates, each once, and its archive is whole."""
    store = Store(run_dir / "archive.db", readonly=True)
    assert store.integrity_problems() == []
    statuses = dict(
        store.conn.execute("SELECT status, COUNT(*) FROM candidates GROUP BY status").fetchall()
    )
    assert statuses.get("done", 0) + statuses.get("failed", 0) == budget, statuses
    assert not statuses.get("proposed") and not statuses.get("evaluating"), statuses
    evaluations = store.conn.execute(
        "SELECT COUNT(*), COUNT(DISTINCT candidate) FROM evaluations WHERE status != 'rejected'"
    ).fetchone()
    assert evaluations == (budget, budget)
    return store


def test_a_short_search_runs_through_a_ray_head(ray_head, tmp_path):
    address, env = ray_head
    run_dir, trace_dir = tmp_path / "run", tmp_path / "traces"
    done = subprocess.run(
        evolve_command(address, run_dir, trace_dir, "search.max_candidates=8"),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "8 evaluated, 0 failed" in done.stdout
    assert f"joined the Ray cluster at {address}" in (run_dir / "evolve.log").read_text()
    check_archive(run_dir, 8).close()
    runs = traces(trace_dir)
    assert len(runs) == 8 and all(r["cmdline"].startswith("ray::") for r in runs)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["best"] >= summary["seed_fitness"]


def test_killing_a_ray_worker_mid_evaluation_loses_no_candidate(ray_head, tmp_path):
    address, env = ray_head
    run_dir, trace_dir = tmp_path / "run", tmp_path / "traces"
    budget = 6
    search = subprocess.Popen(
        evolve_command(
            address,
            run_dir,
            trace_dir,
            f"search.max_candidates={budget}",
            "benchmark.fitness.sleep_s=1.5",
        ),  # fmt: skip
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while len(traces(trace_dir)) < 3:  # the seed, then two candidates of the search
            assert search.poll() is None and time.monotonic() < deadline, search.stdout.read()
            time.sleep(0.05)
        victim = traces(trace_dir)[2]
        os.kill(victim["pid"], signal.SIGKILL)  # the Ray worker evaluating that candidate
        output, _ = search.communicate(timeout=240)
    finally:
        if search.poll() is None:
            os.killpg(search.pid, signal.SIGKILL)
    assert search.returncode == 0, output
    assert f"{budget} evaluated, 0 failed" in output
    store = check_archive(run_dir, budget)
    try:
        evaluation = store.evaluation(victim["candidate"])
        assert evaluation.ok and "WorkerCrashedError" in evaluation.artifacts["lost_workers"]
    finally:
        store.close()
    runs_of_victim = [r for r in traces(trace_dir) if r["candidate"] == victim["candidate"]]
    assert len(runs_of_victim) == 2  # run again by the backend, recorded once
