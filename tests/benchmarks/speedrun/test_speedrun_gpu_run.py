"""The GPU measurement script, run in its reduced CPU mode (torchrun with gloo for the DDP path)."""

from __future__ import annotations

import json

import pytest
from evolve.benchmarks.speedrun import gpu_run
from evolve.benchmarks.speedrun.runner import RunRecord

from evolve.types import EvalStatus


def test_time_to_target_takes_the_first_measurement_at_or_below_it():
    record = RunRecord(
        seed=0, status=EvalStatus.OK, train_s=100.0, loss=4.0, probes=[(30.0, 5.0), (60.0, 4.3)]
    )
    assert gpu_run.time_to(4.3, record) == 60.0
    assert gpu_run.time_to(4.1, record) == 100.0
    assert gpu_run.time_to(3.0, record) is None


@pytest.mark.slow
def test_cpu_mode_runs_every_part(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    assert gpu_run.main(["--cpu", "--work", str(tmp_path / "work")]) == 0
    results = json.loads((tmp_path / "out" / "speedrun_gpu_run.json").read_text())
    assert [r["status"] for r in results["seeds"]["runs"]] == ["ok"] * 3
    assert results["seeds"]["metrics"]["pvalue"] < 0.01  # the CPU target 5.6 is met
    assert [(r["nproc"], r["status"]) for r in results["scaling"]] == [(1, "ok"), (2, "ok")]
    assert all(r["tokens_per_s"] > 0 for r in results["scaling"])
    assert results["seeds"]["curve_mean"]
    assert "scaling of the seed" in capsys.readouterr().out
    assert (tmp_path / "out" / "logs" / "seed-0.txt").is_file()
