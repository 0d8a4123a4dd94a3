"""Where a speedrun evaluation's time goes: its phases add up to its wall time, seeds run side by side included."""

from __future__ import annotations

from pathlib import Path

import pytest
from evolve.benchmarks.speedrun.data import ensure_stdlib_shards

from evolve.harness.fitness import EvalContext, evaluate_safely
from tests.fixtures.speedrun_cpu import cpu_fitness
from tests.harness.test_phases import assert_adds_up

SEED = Path(__file__).resolve().parents[3] / "benchmarks" / "speedrun" / "seed" / "train.py"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    return str(ensure_stdlib_shards(tmp_path_factory.mktemp("speedrun-data") / "stdlib"))


def test_the_phases_of_a_two_seed_evaluation_add_up_to_its_wall_time(data_dir, tmp_path):
    folder = tmp_path / "candidate"
    folder.mkdir()
    (folder / "train.py").write_text(SEED.read_text())
    fitness = cpu_fitness(
        data_dir, n_seeds=2, target=6.0, cpu_parallel=2, overrides={"steps": 20, "warmup_steps": 2}
    )
    ev = evaluate_safely(fitness, folder, EvalContext(seed=0, scratch=tmp_path / "scratch"))
    # both seeds ran and were scored (two seeds rarely prove the target at p < 0.01: any verdict will do)
    assert ev.stage == "all_seeds" and "loss_1" in ev.metrics, ev.artifacts
    spent = assert_adds_up(ev)
    timed = {"run_setup", "sandbox_start", "startup", "training", "checkpoint", "checkpoint_copy"}
    scoring = {"export", "scoring_start", "scoring_load", "scoring_forward", "scoring_exit"}
    timed |= scoring | {"scoring_check"}
    assert {f"time_{name}" for name in timed} <= set(spent)
    assert {"time_first_seed", "time_all_seeds", "time_other_seeds", "time_verdict"} <= set(spent)
    # the first seed's timed training (harness clock) is at most the time the phases give it
    assert spent["time_training"] >= ev.metrics["time_s_0"] - ev.metrics["charged_s_0"]
    # the evaluation process's own phases (the times it reports) fall in place, each one taking time
    assert all(spent[f"time_{name}"] > 0 for name in scoring), spent
