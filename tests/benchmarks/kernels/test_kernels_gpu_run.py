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
            assert all(
                v <= 64 for v in problem.definition.resolve_axes(workload.axes).values() if v != 128
            )


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
    assert (
        gpu_run(
            [
                "--device",
                "cpu",
                "--tiny",
                "--problems",
                "rmsnorm,softmax,silu_and_mul",
                "--out",
                str(out),
            ]
        )
        == 0
    )
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
        result = subprocess.run(
            [sys.executable, "-m", "evolve.benchmarks.kernels", command, "--help"],
            capture_output=True,
            text=True,
        )
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


def test_markdown_covers_seeds_failures_and_skips():
    from evolve.benchmarks.kernels.gpu_run import baseline_rows, markdown

    calibration = {"device": "H200", "torch": "2.11", "bandwidth_bytes_per_s": 4.3e12, "copy_bytes_per_s": 4.2e12,
                   "read_bytes_per_s": 4.3e12, "matrix_flops_per_s": {"bfloat16": 7.5e14, "float8": 1.4e15}}  # fmt: skip
    base = {
        "w1": {
            "bytes": 4.3e9,
            "flops": {},
            "reference_ms": [[3.0, 3.1], [3.0, 3.2]],
            "baseline_ms": [[2.0], [2.02]],
        },
        "w2": {"error": "OutOfMemoryError: CUDA out of memory"},
    }
    rows = baseline_rows(base, calibration)
    assert rows["workloads"][0]["sol_ms"] == pytest.approx(1.0)
    w1 = 1 / (1 + (3.075 - 1.0) / (2.01 - 1.0))  # medians of the repeats' medians
    assert rows["reference_score"] == pytest.approx(
        (w1 + 0.0) / 2, rel=1e-3
    )  # a failed workload counts 0
    seed = {"name": "rmsnorm_triton", "status": "ok", "score": 0.7, "message": "",
            "rows": [{"uuid": "w1", "status": "ok", "kernel_ms": 1.4, "baseline_ms": 2.0, "sol_ms": 1.0, "score": 0.71, "cv": 0.004},
                     {"uuid": "w2", "status": "incorrect", "kernel_ms": None, "baseline_ms": 2.0, "sol_ms": 1.0, "score": None, "cv": None}]}  # fmt: skip
    results = {"started": "now", "seconds": 12.0, "calibration": calibration, "settings": {"repeats": 5},
               "problems": [{"problem": "rmsnorm", **rows, "seed": seed}, {"problem": "softmax", "error": "boom"},
                            {"problem": "layernorm", "skipped": "not started within the time budget"}]}  # fmt: skip
    text = markdown(results)
    assert (
        "| rmsnorm | w1 |" in text and "| softmax | boom |" in text and "not started within" in text
    )
    assert "**0.700**" in text and "max 0.40%" in text and "1400.0 TFLOP/s" in text


def test_timers_mode_times_every_problem_both_ways_at_each_axis_cap(tmp_path):
    out = tmp_path / "out"
    code = gpu_run(
        ["--device", "cpu", "--timers", "suite", "--timer-caps", "8,16", "--out", str(out)]
    )
    assert code == 0
    rows = json.loads((out / "timers.json").read_text())
    assert len(rows) == 2 * len(problem_dirs(SUITE))
    assert all(r["events_ms"] > 0 and r["cupti_ms"] > 0 for r in rows)
    assert {max(r["axes"].values()) for r in rows if r["problem"] == "rmsnorm"} == {8, 16}
    text = (out / "timers.md").read_text()
    assert "| rmsnorm | T=8 H=8 |" in text and "events - CUPTI us" in text


def test_cupti_spans_drop_the_head_start_and_assign_activities_by_start(monkeypatch):
    from evolve.benchmarks.kernels import timing

    monkeypatch.setattr(timing, "_SPIN", lambda cycles: None)
    spin = timing.HEAD_START_NS_MIN
    # window 1: head start, then two kernels 2 us apart; window 2: head start, one kernel
    # whose end the host clock saw after the window closed (still counted: it started inside)
    records = [(100, 100 + spin), (100 + spin + 5_000, 100 + spin + 9_000),
               (100 + spin + 11_000, 100 + spin + 15_000),
               (10**9, 10**9 + spin), (10**9 + spin + 1_000, 10**9 + spin + 4_000)]  # fmt: skip
    windows = [(50, 10**8), (10**9 - 10, 10**9 + spin + 3_000)]
    assert timing._spans(records, windows) == [pytest.approx(0.010), pytest.approx(0.003)]
    assert timing.last_activities() in (1, 2)
    with pytest.raises(RuntimeError, match="lost the head start"):
        timing._spans([(100, 200), (300, 400)], [(50, 500)])
