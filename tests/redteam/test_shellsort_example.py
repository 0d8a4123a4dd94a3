"""The custom-fitness example attacked as a score-hungry gap program would: data it could rebuild, outputs outside the rules."""

from __future__ import annotations

import random

import pytest

from evolve.harness.fitness import EvalContext
from evolve.types import EvalStatus
from examples.shellsort.fitness import ShellSortGaps


def test_the_lists_cannot_be_rebuilt_from_the_seed_the_candidate_is_told():
    fitness = ShellSortGaps(size=50, lists=2)
    assert EvalContext(seed=7).env()["EVOLVE_SEED"] == "7"  # what the program knows
    told = random.Random(7)
    assert fitness.hidden_lists(7) != [[told.random() for _ in range(50)] for _ in range(2)]
    assert fitness.hidden_lists(7) == fitness.hidden_lists(7)  # one evaluation's lists, fixed
    assert ShellSortGaps(size=50, lists=2).hidden_lists(7) != fitness.hidden_lists(7)  # another run's


@pytest.mark.parametrize(
    "printed",
    ["[5, 3]", "[3, 3, 1]", "[2.0, 1]", "[true]", "[100, 1]", "[0]", "[" + "1, " * 70 + "1]", "{}", "no gaps"],
)
def test_gaps_outside_the_rules_are_invalid(printed, tmp_path):
    (tmp_path / "gaps.py").write_text(f"print({printed!r})\n")
    evaluation = ShellSortGaps(size=100, lists=1).evaluate(tmp_path, EvalContext(timeout_s=60))
    assert evaluation.status == EvalStatus.INVALID, evaluation
    assert evaluation.fitness is None
