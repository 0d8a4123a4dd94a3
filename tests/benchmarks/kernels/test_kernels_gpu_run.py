"""gpu_run in its reduced CPU mode (tiny axes, Triton interpreter), the CLI, and the real GPU smoke run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from evolve.benchmarks.kernels.__main__ import main as cli
from evolve.benchmarks.kernels.fitness import SUITE
from evolve.benchmarks.kernels.gpu_run import main as gpu_run
from evolve.benchmarks.kernels.gpu_run import shrink_dataset
from evolve.benchmarks.kernels.spec import load_problem, problem_dirs


def test_shrunk_suite_keeps_every_problem_valid(tmp_path):
    tiny = shrink_dataset(SUITE, tmp_path / "tiny")
    dirs = problem_dirs(tiny)
    assert set(dirs) == set(problem_dirs(SUITE))
    for path in dirs.values():
        problem = load_problem(path)
        for workload in problem.workloads:
            assert all(v <= 64 for v in problem.definition.resolve_axes(workload.axes).values() if v != 128)


def test_gpu_run_reduced_mode_writes_results(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    out = tmp_path / "out"
    code = gpu_run(["--device", "cpu", "--tiny", "--problems", "matmul_bf16", "--out", str(out)])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    (problem,) = results["problems"]
    assert problem["problem"] == "matmul_bf16" and len(problem["workloads"]) == 4
    for row in problem["workloads"]:
        assert row["reference_ms"] > 0 and row["sol_ms"] > 0 and 0 <= row["reference_score"] <= 1
        assert row["flops"]["bfloat16"] > 0
    text = (out / "results.md").read_text()
    assert "bandwidth used for SOL" in text and "matmul_bf16" in text
    assert json.loads((out / "calibration.json").read_text())["bandwidth_bytes_per_s"] > 0


@pytest.mark.slow
def test_gpu_run_reduced_mode_with_triton_seeds(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    out = tmp_path / "out"
    assert gpu_run(["--device", "cpu", "--tiny", "--problems", "rmsnorm,softmax,silu_and_mul", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert [p["seed"]["status"] for p in results["problems"]] == ["ok", "ok", "ok"]


def test_cli_lists_problems_and_explains_the_missing_gpu(capsys, monkeypatch):
    assert cli(["problems"]) == 0
    assert "rmsnorm" in capsys.readouterr().out
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if not torch.cuda.is_available():
        assert cli(["calibrate"]) == 2
        assert "needs a CUDA GPU" in capsys.readouterr().err
    for command in ("problems", "calibrate", "score", "suite"):
        result = subprocess.run([sys.executable, "-m", "evolve.benchmarks.kernels", command, "--help"], capture_output=True, text=True)
        assert result.returncode == 0 and "usage" in result.stdout


@pytest.mark.gpu
def test_gpu_smoke_run(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    out = tmp_path / "out"
    assert gpu_run(["--smoke", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    rms = next(p for p in results["problems"] if p["problem"] == "rmsnorm")
    assert rms["seed"]["status"] == "ok" and 0 < rms["seed"]["score"] <= 1
