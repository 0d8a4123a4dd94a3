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


def test_the_overhead_line_names_each_part_and_its_share_of_training():
    spent = {"harness": 0.1, "startup": 9.9, "training": 200.0, "checkpoint": 1.0}
    spent |= {"checkpoint_copy": 1.0, "audit": 2.0, "export": 0.5, "scoring_load": 3.5}
    spent |= {"scoring_forward": 2.0, "other_seeds": 0.5}
    assert gpu_run.overhead_line(spent) == (
        "overhead 20.5 s = 10.2% of training (200.0 s training): start-up 10.0 s, "
        "checkpoint 2.0 s, audit 2.0 s, export 0.5 s, scoring 5.5 s, other 0.5 s"
    )


@pytest.mark.slow
def test_cpu_mode_runs_every_part(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    cache = tmp_path / "cache"
    assert gpu_run.main(["--cpu", "--work", str(tmp_path / "work"), "--compile-cache", str(cache)]) == 0
    results = json.loads((tmp_path / "out" / "speedrun_gpu_run.json").read_text())
    assert [r["status"] for r in results["seeds"]["runs"]] == ["ok"] * 3
    assert results["seeds"]["metrics"]["pvalue"] < 0.01  # the CPU target 5.6 is met
    assert [(r["nproc"], r["status"]) for r in results["scaling"]] == [(1, "ok"), (2, "ok")]
    assert all(r["tokens_per_s"] > 0 for r in results["scaling"])
    assert results["seeds"]["curve_mean"]
    printed = capsys.readouterr().out
    assert "scaling of the seed" in printed and "% of training (" in printed
    assert "warm-up ok" in printed and list(cache.glob("warmed-*.json"))  # the seed filled it once
    assert (tmp_path / "out" / "logs" / "seed-0.txt").is_file()


def test_strict_cost_scores_the_kept_run_again_both_ways(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    argv = ["--cpu", "--work", str(tmp_path / "work"), "--steps", "60", "--no-scaling"]
    assert gpu_run.main([*argv, "--seeds", "0", "--strict-cost"]) == 0
    seeds = json.loads((tmp_path / "out" / "speedrun_gpu_run.json").read_text())["seeds"]
    usual, strict = seeds["strict_cost"]["rows"]
    assert (usual["strict"], strict["strict"]) == (False, True)
    assert usual["status"] == strict["status"] == "ok", seeds["strict_cost"]
    # the same checkpoint and scored rows: the same loss, whatever probes sit between them
    assert strict["loss"] == pytest.approx(usual["loss"], abs=1e-4)
    assert strict["loss"] == pytest.approx(seeds["runs"][0]["loss"], abs=1e-4)
    assert seeds["strict_cost"]["added_s"] == pytest.approx(strict["eval_s"] - usual["eval_s"])
    assert "strict mode: evaluation" in capsys.readouterr().out


def _part(tmp_path, name: str, seeds_losses: dict[int, float], steps: int = 900) -> str:
    runs = [
        gpu_run.record_dict(
            RunRecord(
                seed=seed,
                status=EvalStatus.OK,
                train_s=300.0 + seed,
                loss=loss,
                init_loss=10.8,
                untimed_s=25.0,
                eval_s=15.0,
                wall_s=350.0,
                params=124_000_000,
                probes=[(60.0, loss + 1.0), (120.0, loss + 0.5)],
            )
        )
        for seed, loss in seeds_losses.items()
    ]
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"seeds": {"steps": steps, "runs": runs}}))
    return str(path)


def test_merge_judges_the_runs_of_several_calls_together(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    a = _part(tmp_path, "a", {0: 4.00, 1: 4.02})
    b = _part(tmp_path, "b", {2: 3.98})
    assert gpu_run.main(["--merge", a, b, "--target", "4.1"]) == 0
    seeds = json.loads((tmp_path / "out" / "speedrun_gpu_run.json").read_text())["seeds"]
    assert [r["seed"] for r in seeds["runs"]] == [0, 1, 2]
    assert seeds["status"] == "ok"
    assert seeds["metrics"]["pvalue"] < 0.01  # mean 4.00, sd 0.02, three seeds, 0.1 below
    assert seeds["metrics"]["time_mean_s"] == pytest.approx(301.0)
    assert seeds["curve_mean"] == [[60.0, 5.0], [120.0, 4.5]]  # mean over seeds, per probe
    assert gpu_run.main(["--merge", a, b, "--target", "4.01"]) == 0  # judged, not met
    seeds = json.loads((tmp_path / "out" / "speedrun_gpu_run.json").read_text())["seeds"]
    assert seeds["status"] == "invalid" and seeds["metrics"]["pvalue"] > 0.01


def test_merge_refuses_a_seed_twice_and_different_step_counts(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    a = _part(tmp_path, "a", {0: 4.0})
    with pytest.raises(SystemExit, match="a seed appears twice"):
        gpu_run.main(["--merge", a, _part(tmp_path, "b", {0: 4.1})])
    with pytest.raises(SystemExit, match="different step counts"):
        gpu_run.main(["--merge", a, _part(tmp_path, "c", {1: 4.1}, steps=800)])
