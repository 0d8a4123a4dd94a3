"""Red team, speedrun (CPU preset): hacks beyond the owner's harness tests, through the real fitness.

The owner's tests (tests/benchmarks/speedrun/test_speedrun_harness.py) cover stopping the
clock early, an unrestored warm-up, a self-reported loss, the warm-up cap, training before
the clock and a model that looks ahead. These add: validation shards read by native code,
NaN weights, exiting early with status 0, a network connection, writes into the harness and
outside the workdir, a process left running and patched time functions.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from evolve.benchmarks.speedrun import fitness as harness
from evolve.benchmarks.speedrun.data import ensure_stdlib_shards

from evolve.fitness import EvalContext, evaluate_safely
from evolve.types import EvalStatus
from tests.fixtures.speedrun_cpu import cpu_fitness
from tests.redteam.helpers import Listener, assert_caught, digest

SEED = Path(harness.__file__).parent / "seed" / "train.py"
ANCHOR = '    files = os.environ["SPEEDRUN_TRAIN_FILES"].split(os.pathsep)\n'
FAILED = (EvalStatus.ERROR, EvalStatus.REJECTED, EvalStatus.INVALID)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    return str(ensure_stdlib_shards(tmp_path_factory.mktemp("speedrun-redteam") / "stdlib"))


def run(data_dir: str, tmp_path: Path, inject: str = "", after: str = ANCHOR, seed: int = 0):
    text = SEED.read_text()
    assert after in text, f"the seed no longer contains {after!r}"
    text = text.replace(after, after + "".join(f"    {line}\n" for line in inject.splitlines()))
    folder = tmp_path / "candidate"
    folder.mkdir()
    (folder / "train.py").write_text(text)
    fitness = cpu_fitness(data_dir, overrides={"steps": 20, "warmup_steps": 2})
    return evaluate_safely(fitness, folder, EvalContext(seed=seed, scratch=tmp_path / "scratch"))


def test_validation_shards_read_by_native_code_are_refused(data_dir, tmp_path):
    # the worst case: the candidate knows the shard's exact path
    shard = sorted(Path(data_dir).glob("*_val_*.bin"))[0]
    inject = f"print('peeked', np.fromfile({str(shard)!r}, dtype=np.uint16)[:8])"
    assert_caught(run(data_dir, tmp_path, inject), FAILED, r"PermissionError|Permission denied")


@pytest.mark.slow  # a full CPU training run (~10-20 s on 2 cores)
def test_nan_weights_are_refused(data_dir, tmp_path):
    inject = "[p.data.fill_(float('nan')) for p in raw.parameters()]"
    ev = run(data_dir, tmp_path, inject, after="    optimizer = make_optimizer(raw, c)\n")
    assert_caught(ev, FAILED, r"nan|finite|loss")


def test_exiting_early_with_status_0_gives_no_score(data_dir, tmp_path):
    ev = run(data_dir, tmp_path, "os._exit(0)")
    assert not ev.ok and ev.fitness is None
    assert_caught(ev, FAILED, r"clock|mark|checkpoint|start|stop|exit")


def test_network_connections_reach_nothing(data_dir, tmp_path):
    listener = Listener()
    try:
        inject = (
            f"import socket\nsocket.create_connection(('127.0.0.1', {listener.port}), timeout=3)"
        )
        ev = run(data_dir, tmp_path, inject)
        assert listener.connections == 0
        assert_caught(
            ev, FAILED, r"ConnectionRefused|unreachable|PermissionError|exited with status"
        )
    finally:
        listener.close()


def test_writes_into_the_harness_and_outside_the_workdir_are_refused(data_dir, tmp_path):
    target, outside = Path(harness.__file__), Path("/tmp") / f"evolve-redteam-{uuid.uuid4().hex}"
    before = digest(target)
    inject = f"open({str(target)!r}, 'a').write('# pwned')\nopen({str(outside)!r}, 'w').write('x')"
    ev = run(data_dir, tmp_path, inject)
    assert digest(target) == before and not outside.exists()
    assert_caught(ev, FAILED, r"PermissionError|Permission denied|Read-only|exited with status")


@pytest.mark.slow  # a full CPU training run (~10-20 s on 2 cores)
def test_a_process_left_running_is_rejected(data_dir, tmp_path):
    inject = "import subprocess\nsubprocess.Popen(['sleep', '120'], start_new_session=True)"
    assert_caught(
        run(data_dir, tmp_path, inject), EvalStatus.REJECTED, r"left \d+ process\(es\) running"
    )


@pytest.mark.slow  # a full CPU training run (~10-20 s on 2 cores)
def test_patched_time_functions_do_not_change_the_harness_clock(data_dir, tmp_path):
    inject = "time.time = time.perf_counter = time.monotonic = lambda: 0.0"
    ev = run(data_dir, tmp_path, inject)
    if ev.ok:
        assert ev.fitness > 0 and ev.metrics["time_mean_s"] > 0  # measured by the harness's clock
    else:
        assert_caught(ev, FAILED, r"clock|time|mark")
