"""Circle packing's feedback and features: which constraints are tight, and the grid's descriptors."""

from __future__ import annotations

from pathlib import Path

from evolve.benchmarks.circle_packing import fitness as harness
from evolve.benchmarks.circle_packing.fitness import CirclePacking
from evolve.benchmarks.circle_packing.shape import contacts, features

from evolve.harness.fitness import Benchmark
from evolve.operators.prompting import Budget, context_values, messages_for, program_view
from evolve.types import Candidate, Parent
from tests.redteam.helpers import evaluate

SEED_DIR = Path(harness.__file__).parent / "seed"


def test_tight_constraints_name_walls_touching_pairs_and_loose_circles():
    # two circles of radius 0.25 side by side on the bottom wall, one small loose circle on top
    centers, radii = [[0.25, 0.25], [0.75, 0.25], [0.5, 0.8]], [0.25, 0.25, 0.1]
    found = contacts(centers, radii)
    assert found.walls == {"left": [0], "right": [1], "bottom": [0, 1], "top": []}
    assert found.pairs == [(0, 1)] and found.loose() == [2]
    text = found.summary()
    assert "2 of 3 circles touch a wall (left 0; right 1; bottom 0 1)" in text
    assert "1 touching pairs (0-1)" in text and "1 loose circles held by fewer than 3 (2)" in text
    values = features(centers, radii, found, code_chars=123)
    assert values["wall_fraction"] == 2 / 3 and values["radius_range"] == 0.15
    assert values["offset"] > 0 and values["code_chars"] == 123.0


def test_a_scored_packing_reports_its_tight_constraints_to_the_prompt_of_its_children():
    fitness = CirclePacking()
    files = {"packing.py": (SEED_DIR / "packing.py").read_text()}
    evaluation = evaluate(fitness, files)
    assert evaluation.ok, evaluation.artifacts
    assert "touching pairs" in evaluation.artifacts["constraints"]
    assert {d.name for d in fitness.descriptors} <= set(evaluation.descriptors)
    benchmark = Benchmark(
        name="circle_packing", fitness=fitness, seed_dir=SEED_DIR, editable=("packing.py",)
    )
    parent = Parent(
        candidate=Candidate(id="p" * 20, seq=1, files=files, operator="seed"), evaluation=evaluation
    )
    budget = Budget(artifact_chars=3000)
    values = context_values(benchmark, parent, [], [], budget)
    values["program"] = program_view(parent, benchmark, budget, label="Program")
    prompt = messages_for("diff.md.j2", values)[1]["content"]
    assert evaluation.artifacts["constraints"] in prompt
    assert len(evaluation.artifacts["constraints"]) < budget.artifact_chars
