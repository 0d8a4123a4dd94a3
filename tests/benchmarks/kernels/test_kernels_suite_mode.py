"""Suite mode: one candidate holds a kernel per problem; per-problem and aggregate scores; a problem descriptor."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from evolve.benchmarks.kernels import suite_fitness
from evolve.benchmarks.kernels.suite_fitness import KernelSuiteFitness, select_problems
from kernels_candidates import CALIBRATION, GOOD, INLINE_CPP
from kernels_fixtures import tiny_rmsnorm

from evolve.harness.fitness import EvalContext, evaluate_safely
from evolve.types import EvalStatus, EvolveError


@pytest.fixture()
def fitness(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    tiny_rmsnorm(tmp_path / "data" / "L1", name="norm_a", rows=(9,))
    tiny_rmsnorm(tmp_path / "data" / "L1", name="norm_b", rows=(5,))
    tiny_rmsnorm(tmp_path / "data" / "L2", name="norm_c", rows=(3,))
    calibration = tmp_path / "calibration.json"
    calibration.write_text(json.dumps(CALIBRATION))
    made = KernelSuiteFitness(category="L1", dataset=str(tmp_path / "data"), device="cpu", rounds=2, warmup=1,
                              iters=4, audits=1, baseline="eager", calibration=str(calibration))  # fmt: skip
    return pickle.loads(pickle.dumps(made))


def _candidate(fitness, tmp_path, kernels: dict[str, str] | None = None):
    workdir = tmp_path / "cand"
    shutil.copytree(fitness.benchmark_overrides["seed"], workdir)
    for name, code in (kernels or {}).items():
        (workdir / name / "kernel.py").write_text(code)
    return workdir


def test_problems_by_name_or_category(tmp_path):
    tiny_rmsnorm(tmp_path / "L1", name="a")
    tiny_rmsnorm(tmp_path / "L2", name="b")
    assert list(select_problems(tmp_path, (), "L2")) == ["b"]
    assert list(select_problems(tmp_path, ("b", "a"), None)) == ["a", "b"]
    with pytest.raises(EvolveError, match="problems \\['zzz'\\] not found"):
        select_problems(tmp_path, ("zzz",), None)


def test_the_seed_holds_a_kernel_per_problem_and_scores_aggregate_as_upstream(fitness, tmp_path):
    assert fitness.benchmark_overrides["gpus"] == 0
    assert [d.name for d in fitness.descriptors] == ["lead_problem", "code_lines"]
    assert fitness.descriptors[0].bins == 2  # one bin per problem
    workdir = _candidate(fitness, tmp_path, {"norm_b": GOOD})
    evaluation = evaluate_safely(fitness, workdir, EvalContext(seed=1))
    assert evaluation.status == EvalStatus.OK, evaluation.artifacts
    m = evaluation.metrics
    phases = {k: v for k, v in m.items() if k.startswith("time_")}
    assert sum(phases.values()) == pytest.approx(evaluation.wall_s, rel=0.02)
    assert (
        phases["time_timing"] > 0
        and phases["time_correctness"] > 0
        and phases["time_process_start"] > 0
    )
    assert evaluation.artifacts["roofline"].count("memory-bound") == 2
    assert set(m) >= {"norm_a/score", "norm_b/score", "norm_a/reference_score", "score"}
    assert evaluation.fitness == pytest.approx((m["norm_a/score"] + m["norm_b/score"]) / 2)
    assert evaluation.descriptors["lead_problem"] in (0.0, 1.0)
    assert (
        "problem norm_a" in evaluation.artifacts["results"]
        and "problem norm_b" in evaluation.artifacts["results"]
    )


def test_an_unchanged_problem_is_not_measured_again_and_a_broken_one_scores_zero(
    fitness, tmp_path, monkeypatch
):
    suite_fitness._MEASURED.clear()
    first = fitness.evaluate(_candidate(fitness, tmp_path), EvalContext(seed=1))
    assert len(suite_fitness._MEASURED) == 2
    broken = _candidate(
        fitness, tmp_path / "second", {"norm_a": "def run(*args):\n    raise ValueError('nope')\n"}
    )
    second = fitness.evaluate(broken, EvalContext(seed=1))
    assert len(suite_fitness._MEASURED) == 3  # only norm_a was measured again
    assert second.status == EvalStatus.OK and second.metrics["norm_a/score"] == 0.0
    assert second.metrics["norm_b/score"] == first.metrics["norm_b/score"]
    assert "norm_a: error" in second.artifacts["failed problems (scored 0)"]


def test_a_cheat_on_one_problem_rejects_the_candidate(fitness, tmp_path):
    evaluation = fitness.evaluate(
        _candidate(fitness, tmp_path, {"norm_b": INLINE_CPP}), EvalContext(seed=1)
    )
    assert evaluation.status == EvalStatus.REJECTED and "norm_b:" in evaluation.artifacts["error"]


def test_the_suite_config_builds(tmp_path, monkeypatch):
    from hydra import compose, initialize_config_dir

    from evolve.launch.config import build_benchmark

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    configs = (suite_fitness.SUITE.parents[2] / "configs").resolve()
    with initialize_config_dir(config_dir=str(configs), version_base=None):
        cfg = compose(config_name="config", overrides=["benchmark=kernels_suite", "benchmark.problems=[rmsnorm,softmax]",
                                                       "benchmark.fitness.device=cpu"])  # fmt: skip
    benchmark = build_benchmark(cfg.benchmark)
    assert sorted(p.name for p in benchmark.seed_dir.iterdir()) == ["rmsnorm", "softmax"]
    assert benchmark.is_editable("softmax/kernel.py") and not benchmark.is_editable(
        "softmax/definition.json"
    )
    assert (
        "EVOLVE-BLOCK-START" in (benchmark.seed_dir / "softmax" / "kernel.py").read_text()
    )  # our Triton seed


def test_the_generated_seed_folder_goes_when_the_process_exits(tmp_path):
    tiny_rmsnorm(tmp_path / "data" / "L1", name="norm_a", rows=(9,))
    script = (
        "import sys\n"
        "from evolve.benchmarks.kernels.suite_fitness import KernelSuiteFitness\n"
        f"made = KernelSuiteFitness(category='L1', dataset={str(tmp_path / 'data')!r}, device='cpu')\n"
        "print(made.benchmark_overrides['seed'])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TRITON_INTERPRET": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    seed = Path(done.stdout.splitlines()[-1])
    assert seed.name.startswith("evolve-kernels-suite-seed-") and not seed.exists()
