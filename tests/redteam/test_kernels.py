"""Red team, kernels: hacks through ``KernelFitness.evaluate`` (the owner's anti-cheat suite drives the harness directly).

CPU part: the tiny RMSNorm problem under Triton's interpreter, as in the owner's tests.
GPU part (``-m gpu``): patched CUDA events, lazy output tensors, outputs cached across calls
and a proxy output on the real rmsnorm problem of our suite.
"""

from __future__ import annotations

import importlib.util
import json
import textwrap
import uuid
from pathlib import Path

import pytest
from evolve.benchmarks.kernels.fitness import KernelFitness

from evolve.fitness import EvalContext, evaluate_safely
from evolve.types import EvalStatus
from tests.redteam.helpers import Listener, assert_caught

OWNER_TESTS = Path(__file__).resolve().parents[1] / "benchmarks" / "kernels"


def _owner_module(name: str):
    spec = importlib.util.spec_from_file_location(f"redteam_{name}", OWNER_TESTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FIXTURES = _owner_module("kernels_fixtures")
GOOD = textwrap.dedent(
    """
    import torch

    def run(x, weight, eps, y):
        xf = x.float()
        y.copy_((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(y.dtype))
    """
)
FAILED = (EvalStatus.ERROR, EvalStatus.INVALID, EvalStatus.REJECTED)


@pytest.fixture(scope="module")
def fitness(tmp_path_factory):
    patch = pytest.MonkeyPatch()
    patch.setenv("TRITON_INTERPRET", "1")  # Triton's interpreter on CPU, as in the owner's tests
    root = tmp_path_factory.mktemp("kernels-redteam")
    FIXTURES.tiny_rmsnorm(root, rows=(33,))
    calibration = root / "calibration.json"
    calibration.write_text(
        json.dumps(
            {
                "device": "test",
                "bandwidth_bytes_per_s": 1e9,
                "matrix_flops_per_s": {"bfloat16": 1e11},
            }
        )
    )
    yield KernelFitness(
        problem="tiny_rmsnorm",
        dataset=str(root),
        device="cpu",
        rounds=2,
        warmup=1,
        iters=4,
        audits=1,
        baseline="eager",
        calibration=str(calibration),
    )
    patch.undo()


def evaluate(fitness, tmp_path: Path, code: str, name: str = "cand"):
    workdir = tmp_path / name
    workdir.mkdir()
    (workdir / "kernel.py").write_text(code)
    return evaluate_safely(fitness, workdir, EvalContext(seed=1, timeout_s=120))


@pytest.mark.slow  # the first kernel evaluation measures baselines (~30 s on CPU)
def test_the_honest_kernel_passes_with_two_seeds(fitness, tmp_path):
    for seed in (1, 2):
        workdir = tmp_path / f"s{seed}"
        workdir.mkdir()
        (workdir / "kernel.py").write_text(GOOD)
        ev = evaluate_safely(fitness, workdir, EvalContext(seed=seed, timeout_s=120))
        assert ev.ok and ev.fitness > 0, dict(ev.artifacts)


def test_rewriting_the_reference_in_the_workdir_changes_nothing(fitness, tmp_path):
    # the harness copies reference.py and definition.json into the workdir for the candidate to
    # read; a kernel that rewrites them to agree with its wrong answer must still be wrong
    code = textwrap.dedent(
        """
        import json, pathlib
        pathlib.Path("reference.py").write_text("import torch\\ndef run(x, weight, eps):\\n    return x.clone()\\n")
        d = json.loads(pathlib.Path("definition.json").read_text())
        d["reference"] = pathlib.Path("reference.py").read_text()
        pathlib.Path("definition.json").write_text(json.dumps(d))

        def run(x, weight, eps, y):
            y.copy_(x)
        """
    )
    assert_caught(
        evaluate(fitness, tmp_path, code), FAILED, r"mismatch|elements|tolerance|wrong|pass"
    )


@pytest.mark.slow  # the first kernel evaluation measures baselines (~30 s on CPU)
def test_nan_output_is_invalid(fitness, tmp_path):
    code = "import torch\n\ndef run(x, weight, eps, y):\n    y.fill_(float('nan'))\n"
    assert_caught(evaluate(fitness, tmp_path, code), FAILED, r"nan|finite")


@pytest.mark.slow  # the first kernel evaluation measures baselines (~30 s on CPU)
def test_exiting_early_with_status_0_is_not_scored(fitness, tmp_path):
    ev = evaluate(fitness, tmp_path, "import os\nos._exit(0)\n" + GOOD)
    assert not ev.ok and ev.fitness is None
    assert_caught(ev, FAILED, r"exit|report|verdict|driver")


@pytest.mark.slow  # the first kernel evaluation measures baselines (~30 s on CPU)
def test_network_connections_reach_nothing(fitness, tmp_path):
    listener = Listener()
    try:
        code = (
            f"import socket\nsocket.create_connection(('127.0.0.1', {listener.port}), timeout=3)\n"
            + GOOD
        )
        ev = evaluate(fitness, tmp_path, code)
        assert listener.connections == 0
        assert_caught(ev, FAILED, r"ConnectionRefused|unreachable|PermissionError")
    finally:
        listener.close()


@pytest.mark.slow  # the first kernel evaluation measures baselines (~30 s on CPU)
def test_writes_outside_the_workdir_are_refused(fitness, tmp_path):
    target = Path("/tmp") / f"evolve-redteam-{uuid.uuid4().hex}"
    ev = evaluate(fitness, tmp_path, f"open({str(target)!r}, 'w').write('x')\n" + GOOD)
    assert not target.exists()
    assert_caught(ev, FAILED, r"PermissionError|Permission denied")


def test_outputs_cached_across_calls_are_caught(fitness, tmp_path):
    code = _owner_module("kernels_candidates").CACHED_OUTPUT
    assert_caught(
        evaluate(fitness, tmp_path, code), FAILED, r"although the correctness rounds passed|cache"
    )


# --- GPU: the real rmsnorm problem of our suite ---------------------------------------------

GPU_QUICK = {"rounds": 2, "warmup": 1, "iters": 10, "audits": 1, "quick_calibration": True}

PATCHED_EVENTS = textwrap.dedent(
    """
    import torch
    torch.cuda.Event.elapsed_time = lambda self, end: 1e-6  # claim every call took a nanosecond
    """
) + GOOD.replace("y.copy_(", "y.copy_(").replace("import torch\n", "", 1)

LAZY_OUTPUT = textwrap.dedent(
    """
    import torch

    class Lazy(torch.Tensor):  # a tensor subclass that would compute only when looked at
        pass

    def run(x, weight, eps, y):
        xf = x.float()
        out = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(y.dtype)
        y.set_(out.as_subclass(Lazy))
    """
)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("name", "code", "reason"),
    [
        ("patched CUDA events", PATCHED_EVENTS, r"elapsed_time|timer|patched"),
        ("lazy output tensor", LAZY_OUTPUT, r"replaced|subclass|reshaped|proxy"),
        ("outputs cached across calls", None, r"although the correctness rounds passed"),
    ],
)
def test_gpu_cheats_through_the_fitness(tmp_path, name, code, reason):
    code = code or _owner_module("kernels_candidates").CACHED_OUTPUT
    fitness = KernelFitness(problem="rmsnorm", device="cuda", baseline="eager", **GPU_QUICK)
    ev = evaluate(fitness, tmp_path, code, name.replace(" ", "_"))
    assert_caught(ev, FAILED, reason)


@pytest.mark.gpu
def test_gpu_honest_reference_passes(tmp_path):
    seed = (
        Path(__import__("evolve.benchmarks.kernels", fromlist=["x"]).__file__).parent
        / "seeds"
        / "reference"
    )
    fitness = KernelFitness(problem="rmsnorm", device="cuda", baseline="eager", **GPU_QUICK)
    ev = evaluate(fitness, tmp_path, (seed / "kernel.py").read_text())
    assert ev.ok and ev.fitness > 0, dict(ev.artifacts)
