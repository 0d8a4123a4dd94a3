"""The Ray backend against a real local Ray cluster in this process: placement, timeouts, lost workers."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from pathlib import Path

import pytest

from evolve.backends import LocalBackend
from evolve.backends import ray as ray_backend
from evolve.backends.ray import (
    CONFIG_KEYS,
    RayBackend,
    RayBackendError,
    _check_reachable,
    import_ray,
)
from evolve.sandbox import unreadable
from evolve.types import EvalStatus, Job, content_hash
from tests.backends.fitnesses import Traced, other_version_task, traces

REPO = Path(__file__).resolve().parents[2]
SEED = {"params.py": (REPO / "tests/backends/seed/params.py").read_text()}


def job(files=SEED, *, timeout_s: float = 20.0) -> Job:
    return Job(candidate_id=content_hash(files), files=files, seed=1, timeout_s=timeout_s)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is dead, only not yet reaped
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


def gone_soon(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster with 2 CPUs, started once for this module; backends reuse it."""
    ray = pytest.importorskip("ray")
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(REPO)  # workers import the test fitness from the repository
    ray.init(address="local", num_cpus=2, num_gpus=0, include_dashboard=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        if previous is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = previous


def evaluate(backend, the_job):
    return asyncio.run(backend.evaluate(0, the_job))


def test_without_ray_the_backend_fails_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what an environment without Ray looks like
    with pytest.raises(RayBackendError, match=r"pip install 'evolve\[ray\]'"):
        import_ray()
    with pytest.raises(RayBackendError, match="not installed"):
        RayBackend(fitness=Traced())


def test_an_evaluation_runs_in_a_ray_worker_and_scores_as_locally(ray_cluster, tmp_path):
    backend = RayBackend(fitness=Traced(trace_dir=str(tmp_path)), workers=2)
    local = LocalBackend(fitness=Traced(), workers=1)
    try:
        remote, here = evaluate(backend, job()), evaluate(local, job())
    finally:
        backend.close()
        local.close()
    assert remote.status == EvalStatus.OK and remote.fitness == here.fitness
    assert remote.descriptors == here.descriptors and remote.seeds == (1,)
    [trace] = traces(tmp_path)
    assert trace["cmdline"].startswith("ray::") and trace["pid"] != os.getpid()
    assert trace["gpu"] is None
    assert ray_cluster.is_initialized(), "a backend must not end a connection it did not make"


def test_a_candidate_in_a_ray_task_cannot_read_the_runs_directory(ray_cluster, tmp_path):
    """The run's directory (``evolve.sandbox.unreadable``: its archive holds every earlier evaluation's
    output) is hidden from candidates on Ray workers as on local ones."""
    archive = tmp_path / "run" / "archive.db"
    archive.parent.mkdir()
    archive.write_text("every earlier evaluation's output")
    backend = RayBackend(fitness=Traced(trace_dir=str(tmp_path / "traces"), peek=str(archive)))
    try:
        with unreadable.hidden(archive.parent):
            result = evaluate(backend, job())
    finally:
        backend.close()
    assert result.status == EvalStatus.OK
    assert [t["peeked"] for t in traces(tmp_path / "traces") if "peeked" in t] == ["refused"]


def test_slots_follow_the_cluster_resources(ray_cluster):
    assert RayBackend(fitness=Traced()).slots == 2
    assert RayBackend(fitness=Traced(), num_cpus=2).slots == 1
    assert RayBackend(fitness=Traced(), workers=5).slots == 5  # explicit: tasks queue in Ray
    with pytest.raises(RayBackendError, match=r"too little GPU.*ray start --address"):
        RayBackend(fitness=Traced(), gpus_per_eval=1)


def test_an_address_where_nothing_listens_fails_at_once_with_the_fix():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    start = time.monotonic()
    with pytest.raises(RayBackendError, match=rf"nothing answers.*ray start --head --port={port}"):
        _check_reachable(f"127.0.0.1:{port}")
    assert time.monotonic() - start < 5
    _check_reachable("auto")  # left to Ray, as are local and addresses it parses itself


def test_unknown_config_keys_are_refused_with_the_valid_ones():
    with pytest.raises(RayBackendError, match="unknown key.*'adress'.*valid keys: address"):
        RayBackend.from_config(
            {"name": "ray", "adress": "auto"}, fitness=Traced(), gpus_per_eval=0, workers=None
        )


def test_the_config_group_matches_the_backend():
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="evolve.configs", version_base=None):
        node = compose(config_name="config", overrides=["backend=ray"]).backend
    assert node.name == "ray" and set(node) - {"name"} == set(CONFIG_KEYS)
    assert node.address == "auto"


def test_a_hanging_harness_times_out_and_its_worker_is_killed(ray_cluster, tmp_path):
    backend = RayBackend(fitness=Traced(trace_dir=str(tmp_path), hang_s=600), grace_s=0.5)
    start = time.monotonic()
    try:
        result = evaluate(backend, job(timeout_s=0.5))
    finally:
        backend.close()
    assert result.status == EvalStatus.TIMEOUT and "killed" in result.artifacts["error"]
    assert time.monotonic() - start < 30
    [trace] = traces(tmp_path)
    assert gone_soon(trace["pid"]), "the Ray worker running the hung harness is still alive"


def test_candidate_processes_die_at_the_timeout_inside_the_task(ray_cluster, tmp_path):
    backend = RayBackend(fitness=Traced(trace_dir=str(tmp_path), sleeper=True))
    try:
        result = evaluate(backend, job(timeout_s=1.0))
    finally:
        backend.close()
    assert result.status == EvalStatus.TIMEOUT and "timed out" in result.artifacts["error"]
    child = next(t["child"] for t in traces(tmp_path) if "child" in t)
    assert child > 0 and not alive(child)


def test_a_lost_worker_is_run_again_and_returns_one_evaluation(ray_cluster, tmp_path):
    backend = RayBackend(fitness=Traced(trace_dir=str(tmp_path), die="once"), max_attempts=3)
    try:
        result = evaluate(backend, job())
    finally:
        backend.close()
    assert result.status == EvalStatus.OK
    assert "attempt 1: WorkerCrashedError" in result.artifacts["lost_workers"]
    runs = traces(tmp_path)
    assert len(runs) == 2 and runs[0]["pid"] != runs[1]["pid"]


def test_a_worker_that_always_dies_is_a_failed_evaluation_after_max_attempts(ray_cluster, tmp_path):
    backend = RayBackend(fitness=Traced(trace_dir=str(tmp_path), die="always"), max_attempts=2)
    try:
        result = evaluate(backend, job())
    finally:
        backend.close()
    assert result.status == EvalStatus.ERROR and "all 2 attempts" in result.artifacts["error"]
    assert result.artifacts["lost_workers"].count("WorkerCrashedError") == 2
    assert len(traces(tmp_path)) == 2


def test_cancelling_an_evaluation_kills_its_ray_task(ray_cluster, tmp_path):
    backend = RayBackend(fitness=Traced(trace_dir=str(tmp_path), hang_s=600))

    async def start_then_cancel():
        task = asyncio.create_task(backend.evaluate(0, job()))
        while not traces(tmp_path):
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(start_then_cancel())
    finally:
        backend.close()
    [trace] = traces(tmp_path)
    assert gone_soon(trace["pid"]), "an interrupted run left its evaluation running on the cluster"


def test_a_worker_seeing_other_harness_files_stops_the_run_before_scoring(
    ray_cluster, tmp_path, monkeypatch
):
    harness = tmp_path / "harness.py"
    harness.write_text("MEASURE = 1\n")
    specs = ["pkg://tests.backends/fitnesses.py", str(harness)]
    trace_dir = tmp_path / "traces"
    backend = RayBackend(fitness=Traced(trace_dir=str(trace_dir)), harness=specs)
    unchecked = RayBackend(fitness=Traced(), harness=specs, check_harness=False)
    cancelled = []
    monkeypatch.setattr(ray_cluster, "cancel", lambda *a, **k: cancelled.append(a))
    try:
        assert evaluate(backend, job()).ok  # the workers see the same files as the driver
        harness.write_text("MEASURE = 2\n")  # as a node with another version would
        with pytest.raises(RayBackendError, match=r"harness files on Ray node .* differ"):
            evaluate(backend, job())
        assert evaluate(unchecked, job()).ok
    finally:
        backend.close()
        unchecked.close()
    assert len(traces(trace_dir)) == 1, "the task on the mismatched node must not evaluate"
    # Its task returns by itself; a forced cancel meeting that return crashed Ray's driver (and
    # with it CI's pytest) about once in 250 (Ray 2.60, "Tried to complete task that was not pending").
    assert cancelled == [], "the mismatched node's task was cancelled instead of left to end"


def test_a_node_running_other_code_is_cancelled_when_its_task_goes_on(
    ray_cluster, tmp_path, monkeypatch
):
    monkeypatch.setattr(ray_backend, "MISMATCH_END_S", 1.0)
    backend = RayBackend(fitness=Traced(trace_dir=str(tmp_path)), harness=[str(tmp_path / "h.py")])
    backend._task = ray_cluster.remote(num_cpus=1, max_retries=0, num_returns="streaming")(
        other_version_task
    )
    start = time.monotonic()
    try:
        with pytest.raises(RayBackendError, match=r"harness files on Ray node elsewhere differ"):
            evaluate(backend, job())
    finally:
        backend.close()
    assert time.monotonic() - start < 30
    assert gone_soon(int((tmp_path / "pid").read_text())), "the task that went on was not killed"


def test_a_candidate_that_breaks_the_job_fails_alone(ray_cluster):
    escaping = {"params.py": SEED["params.py"], "../outside.py": "x = 1\n"}
    backend = RayBackend(fitness=Traced())
    try:
        result = evaluate(backend, job(escaping))
        assert evaluate(backend, job()).ok  # the next candidate runs as usual
    finally:
        backend.close()
    assert (
        result.status == EvalStatus.ERROR
        and "escapes the working directory" in result.artifacts["error"]
    )


def test_a_fitness_the_workers_cannot_import_names_the_fix(ray_cluster, tmp_path, monkeypatch):
    (tmp_path / "faraway_fitness.py").write_text(
        "from tests.backends.fitnesses import Traced\n\n\nclass Faraway(Traced):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))  # importable here, on no Ray worker
    from faraway_fitness import Faraway

    backend = RayBackend(fitness=Faraway())
    try:
        with pytest.raises(RayBackendError, match="installed on every node"):
            evaluate(backend, job())
    finally:
        backend.close()
