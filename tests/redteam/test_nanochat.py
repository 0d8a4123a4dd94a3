"""Red team, nanochat (CPU scale): hacks beyond the owner's rejection tests, through the real fitness.

The owner's tests (tests/benchmarks/nanochat/test_nanochat_harness.py) cover a printed score,
reading validation data through Python, a non-causal model, training past the budget and
before the clock. These add: validation data read by native code, NaN weights, exiting early
with status 0, a network connection, writes outside the workdir, a process left running,
patched time functions, and a checkpoint that changes the evaluation's sequence length.
"""

from __future__ import annotations

import sysconfig
import uuid
from pathlib import Path

import pytest
from evolve.benchmarks.nanochat import prepare
from evolve.benchmarks.nanochat.sources import chunk_text

from evolve.fitness import EvalContext, evaluate_safely
from evolve.types import EvalStatus
from tests.fixtures.nanochat_tiny import tiny_fitness
from tests.redteam.helpers import Listener, assert_caught

SEED = Path(prepare.__file__).parent / "seed_cpu"
ANCHOR = "torch.manual_seed(settings.seed)\n"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("nanochat-redteam")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [
        c
        for name in ("argparse.py", "textwrap.py", "pathlib.py")
        for c in chunk_text((stdlib / name).read_text())
    ]
    val = list(chunk_text((stdlib / "string.py").read_text()))
    prepare.build(
        root / "tiny", train=lambda: texts, val=lambda: val * 3, vocab_size=512, log=lambda _: None
    )
    return root


def run(data_dir: Path, tmp_path: Path, inject: str = "", replace: tuple[str, str] | None = None):
    files = {p.name: p.read_text() for p in SEED.glob("*.py")}
    assert ANCHOR in files["train.py"]
    files["train.py"] = files["train.py"].replace(ANCHOR, ANCHOR + inject)
    if replace:
        name, (old, new) = replace[0], replace[1]
        assert old in files[name]
        files[name] = files[name].replace(old, new)
    work = tmp_path / "work"
    work.mkdir()
    for name, text in files.items():
        (work / name).write_text(text)
    fitness = tiny_fitness(data_dir)
    return evaluate_safely(fitness, work, EvalContext(seed=0, scratch=tmp_path))


def test_validation_data_read_by_native_code_is_refused(data_dir, tmp_path):
    inject = (
        "import numpy, pathlib\n"
        "_val = pathlib.Path(next(p for p in __import__('json').loads(__import__('os').environ['NANOCHAT_CONFIG'])['forbidden'] if p.endswith('val'))) / 'tokens.bin'\n"
        "print('peeked at', len(numpy.fromfile(str(_val), dtype=numpy.uint8)), 'validation bytes')\n"
    )
    ev = run(data_dir, tmp_path, inject)
    assert not ev.ok, "validation data was readable by native code"
    assert_caught(
        ev, (EvalStatus.REJECTED, EvalStatus.ERROR), r"PermissionError|Permission denied|forbidden"
    )


@pytest.mark.slow  # trains a model (~10-45 s on 2 cores)
def test_nan_weights_are_not_scored(data_dir, tmp_path):
    inject = "import math\n_nan = float('nan')\n"
    replace = (
        "train.py",
        (
            "client.save_checkpoint(",
            "[p.data.fill_(_nan) for p in model.parameters()]\nclient.save_checkpoint(",
        ),
    )
    ev = run(data_dir, tmp_path, inject, replace)
    assert_caught(ev, (EvalStatus.INVALID, EvalStatus.REJECTED, EvalStatus.ERROR), r"finite|nan")


def test_exiting_early_with_status_0_gives_no_score(data_dir, tmp_path):
    ev = run(data_dir, tmp_path, "import os\nos._exit(0)\n")
    assert not ev.ok and ev.fitness is None
    assert_caught(
        ev, (EvalStatus.ERROR, EvalStatus.INVALID, EvalStatus.REJECTED), r"checkpoint|exit|verdict"
    )


@pytest.mark.slow  # trains a model (~10-45 s on 2 cores)
def test_network_connections_reach_nothing(data_dir, tmp_path):
    listener = Listener()
    try:
        inject = (
            f"import socket\nsocket.create_connection(('127.0.0.1', {listener.port}), timeout=3)\n"
        )
        ev = run(data_dir, tmp_path, inject)
        assert listener.connections == 0
        assert_caught(
            ev,
            (EvalStatus.ERROR, EvalStatus.REJECTED),
            r"ConnectionRefused|unreachable|PermissionError",
        )
    finally:
        listener.close()


@pytest.mark.slow  # trains a model (~10-45 s on 2 cores)
def test_writes_outside_the_workdir_are_refused(data_dir, tmp_path):
    target = Path("/tmp") / f"evolve-redteam-{uuid.uuid4().hex}"
    ev = run(data_dir, tmp_path, f"open({str(target)!r}, 'w').write('out')\n")
    assert not target.exists()
    assert_caught(
        ev, (EvalStatus.ERROR, EvalStatus.REJECTED), r"PermissionError|Permission denied|forbid"
    )


def test_a_process_left_running_is_not_scored(data_dir, tmp_path):
    inject = "import subprocess\nsubprocess.Popen(['sleep', '120'], start_new_session=True)\n"
    ev = run(data_dir, tmp_path, inject)
    assert_caught(
        ev,
        (EvalStatus.REJECTED, EvalStatus.ERROR, EvalStatus.TIMEOUT),
        r"left|process|running|forbid",
    )


@pytest.mark.slow  # trains a model (~10-45 s on 2 cores)
def test_patched_time_functions_do_not_stretch_the_budget(data_dir, tmp_path):
    inject = "import time\n_t0 = time.monotonic\ntime.monotonic = time.perf_counter = time.time = lambda: 0.0\n"
    ev = run(data_dir, tmp_path, inject)
    if ev.ok:  # the harness's own clock measured the run: the budget held
        assert ev.metrics["training_s"] < 2.0 + 15.0
    else:
        assert_caught(
            ev,
            (EvalStatus.REJECTED, EvalStatus.ERROR, EvalStatus.TIMEOUT),
            r"clock|time|budget|limit",
        )


@pytest.mark.slow  # trains a model (~10-45 s on 2 cores)
def test_honest_seed_passes_with_two_seeds(data_dir, tmp_path):
    for seed in (0, 3):
        files = {p.name: p.read_text() for p in SEED.glob("*.py")}
        work = tmp_path / f"work{seed}"
        work.mkdir()
        for name, text in files.items():
            (work / name).write_text(text)
        fitness = tiny_fitness(data_dir)
        ev = evaluate_safely(fitness, work, EvalContext(seed=seed, scratch=tmp_path))
        assert ev.ok, dict(ev.artifacts)
