"""Where a nanochat evaluation's time goes, and the profile of its timed steps reaching its children's prompts.

One real evaluation of the CPU seed (2-second budget, tiny dataset) through the sandbox,
supervisor and scorer.
"""

from pathlib import Path

import pytest
from evolve.benchmarks.nanochat import prepare

from evolve.harness.fitness import Benchmark, EvalContext, evaluate_safely
from evolve.operators.mutate import Diff
from evolve.operators.prompting import Budget, context_values, messages_for, program_view
from evolve.types import Candidate, Parent
from tests.fixtures.nanochat_tiny import tiny_fitness
from tests.harness.test_phases import assert_adds_up

SEED = Path(prepare.__file__).parent / "seed"  # one program for both scales


@pytest.fixture(scope="module")
def evaluated(data_dir, tmp_path_factory):
    files = {p.name: p.read_text() for p in SEED.glob("*.py")}
    work = tmp_path_factory.mktemp("work")
    for name, text in files.items():
        (work / name).write_text(text)
    fitness = tiny_fitness(data_dir)
    scratch = tmp_path_factory.mktemp("scratch")
    return fitness, files, evaluate_safely(fitness, work, EvalContext(seed=0, scratch=scratch))


def test_the_phases_of_an_evaluation_add_up_to_its_wall_time(evaluated):
    _, _, ev = evaluated
    assert ev.ok, dict(ev.artifacts)
    spent = assert_adds_up(ev)
    phases = {"startup", "warmup", "training", "checkpoint", "export", "scoring_start", "scoring_forward"}
    assert {f"time_{name}" for name in phases} <= set(spent)
    # the harness's own clock: the timed phase is the budget (2 s) up to the last step's end
    assert spent["time_training"] >= 2.0 and spent["time_training"] < ev.metrics["train_wall_s"]


def test_the_profile_of_a_few_timed_steps_reaches_a_childs_prompt(evaluated, tmp_path):
    fitness, files, ev = evaluated
    profile = ev.artifacts["profile"]
    assert "profile of 3 timed steps" in profile and "tokens/s" in profile
    assert "share of wall time:" in profile and "matmul" in profile and "optimizer" in profile
    assert "aten::mm" in profile  # the top ops by time
    benchmark = Benchmark(name="nanochat", fitness=fitness, seed_dir=SEED, editable=("*.py",))
    parent = Parent(
        candidate=Candidate(id="p" * 12, seq=1, files=files, operator="seed"), evaluation=ev
    )
    budget = Budget()  # llm.artifact_chars' default: all artifacts together within it
    values = context_values(benchmark, parent, [], [], budget)
    values["program"] = program_view(parent, benchmark, budget, label="Program")
    prompt = messages_for(Diff.template, values)[1]["content"]
    assert profile.splitlines()[-1] in prompt and "share of wall time:" in prompt
