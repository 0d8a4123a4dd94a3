"""Correctness checks: comparison rules, and whole evaluations of right and wrong kernels (CPU)."""

from __future__ import annotations

import importlib.util
import json
import pickle

import pytest
import torch
from evolve.benchmarks.kernels.compare import error_stats, verdict
from evolve.benchmarks.kernels.fitness import SUITE, KernelFitness
from evolve.benchmarks.kernels.gpu_run import HERE
from evolve.benchmarks.kernels.spec import Tolerance
from kernels_candidates import (
    CALIBRATION,
    GOOD,
    IGNORES_WEIGHT,
    NAN,
    RAISES,
    WRONG_SHAPE,
    ZEROS,
    evaluate_many,
)
from kernels_fixtures import tiny_rmsnorm

from evolve.harness.fitness import EvalContext
from evolve.types import EvalStatus, EvolveError


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("kernels-correctness")
    tiny_rmsnorm(root, rows=(33,))
    return root


def _stats(out, ref, tol=None):
    tol = tol or Tolerance()
    return verdict(error_stats(out, ref, tol), tol)


def test_comparison_rules():
    ref = torch.linspace(1, 2, 1000)
    assert _stats(ref.clone(), ref) is None
    assert _stats(ref * 1.009, ref) is None  # inside rtol
    near = ref.clone()
    near[:10] += 1.0  # 1% of elements off: exactly at the 99% threshold
    assert _stats(near, ref) is None
    near[:11] += 1.0
    assert "within atol" in _stats(near, ref)
    assert "NaN/Inf" in _stats(torch.where(ref > 1.5, float("nan"), ref), ref)
    assert "NaN/Inf" in _stats(torch.where(ref > 1.9, float("inf"), ref), ref)
    assert "all zeros" in _stats(torch.zeros(1000), ref)
    assert (
        _stats(torch.zeros(3), torch.zeros(3)) is None
    )  # zeros are fine where the reference is zero
    assert "shape" in _stats(torch.zeros(999), ref)
    assert "dtype" in _stats(ref.to(torch.bfloat16), ref)
    one_off = ref.clone()
    one_off[0] += 1.0  # 99.9% of elements pass, but one error is over the cap
    assert _stats(one_off, ref) is None
    assert "over the cap" in _stats(one_off, ref, Tolerance(max_error_cap=0.5))


TRITON_SEED = (HERE / "seeds" / "rmsnorm_triton" / "kernel.py").read_text()
TRITON_BROKEN = TRITON_SEED.replace("(x * rstd * w)", "(x * w)")  # forgets to normalise


@pytest.fixture(scope="module")
def reports(dataset):
    """All candidates of this module evaluated once, a few in parallel."""
    codes = {
        "good": GOOD,
        "ignores weight": IGNORES_WEIGHT,
        "nan": NAN,
        "zeros": ZEROS,
        "resize": WRONG_SHAPE,
        "raises": RAISES,
    }
    if importlib.util.find_spec("triton") is not None:
        codes |= {"triton": TRITON_SEED, "triton broken": TRITON_BROKEN}
    return evaluate_many(dataset, codes, dataset / "work")


def test_a_pytorch_kernel_passes_and_is_timed(reports):
    report = reports["good"]
    assert report.status == "ok", report.message
    row = report.rows[0]
    assert row.kernel_ms > 0 and row.baseline_ms > 0 and row.sol_ms > 0 and report.score > 0
    assert report.kernels  # the ops it launched were recorded


@pytest.mark.parametrize(
    ("name", "reason"),
    [("ignores weight", "of elements within"), ("nan", "NaN/Inf"), ("zeros", "all zeros")],
)
def test_wrong_kernels_are_invalid_with_the_reason(reports, name, reason):
    report = reports[name]
    assert report.status == "invalid" and reason in report.message, report.message


def test_a_crashing_kernel_is_an_error_with_its_traceback(reports):
    report = reports["raises"]
    assert report.status == "error"
    assert (
        "ValueError: block size too large for this row" in report.message
        and "Traceback" in report.message
    )


def test_resizing_the_output_leaves_the_timers_output_unwritten(reports):
    """The output's storage is the timer's arena: a resized view writes none of it."""
    report = reports["resize"]
    assert report.status in ("invalid", "error") and "round 0" in report.message, report.message


def test_triton_kernel_under_the_interpreter(reports):
    if "triton" not in reports:
        pytest.skip("Triton is not installed: pip install 'evolve[gpu]'")
    assert TRITON_BROKEN != TRITON_SEED
    assert reports["triton"].status == "ok", reports["triton"].message + reports["triton"].output
    broken = reports["triton broken"]
    assert broken.status == "invalid" and "of elements within" in broken.message


def test_fitness_through_evolve_contract(dataset, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    calibration = tmp_path / "calibration.json"
    calibration.write_text(json.dumps(CALIBRATION))
    fitness = KernelFitness(problem="tiny_rmsnorm", dataset=str(dataset), device="cpu", rounds=2, warmup=1, iters=4,
                            audits=1, baseline="eager", calibration=str(calibration))  # fmt: skip
    fitness = pickle.loads(pickle.dumps(fitness))  # it travels to worker processes
    workdir = tmp_path / "cand"
    workdir.mkdir()
    (workdir / "kernel.py").write_text(
        (SUITE.parent / "seeds" / "reference" / "kernel.py").read_text()
    )
    evaluation = fitness.evaluate(workdir, EvalContext(seed=1))
    assert evaluation.status == EvalStatus.OK, evaluation.artifacts
    assert evaluation.fitness > 0 and evaluation.metrics["score"] == evaluation.fitness
    assert set(evaluation.descriptors) == {"kernels_launched", "code_lines"}
    assert "Reference (reference.py)" in evaluation.artifacts["problem"]
    assert (workdir / "reference.py").is_file() and (workdir / "definition.json").is_file()


def test_without_a_gpu_the_fitness_refuses_to_start_and_names_the_fix(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(EvolveError, match="needs a CUDA GPU.*TRITON_INTERPRET=1"):
        KernelFitness(problem="rmsnorm")
