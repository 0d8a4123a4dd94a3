"""The SOL score at its anchor points and edge case, and its aggregates."""

from __future__ import annotations

import pytest
from evolve.benchmarks.kernels.score import (
    above_sol,
    coefficient_of_variation,
    problem_score,
    sol_score,
    suite_score,
)


def test_anchor_points():
    assert sol_score(2.0, 2.0, 1.0) == pytest.approx(0.5)  # at the baseline
    assert sol_score(1.0, 2.0, 1.0) == pytest.approx(1.0)  # at the speed of light
    assert sol_score(3.0, 2.0, 1.0) == pytest.approx(
        1 / 3
    )  # twice the baseline's distance from SOL
    assert sol_score(1.5, 2.0, 1.0) == pytest.approx(2 / 3)
    assert sol_score(1e9, 2.0, 1.0) < 1e-8  # very slow kernels go to 0
    assert sol_score(2.0, 4.0, 0.0) == pytest.approx(2 / 3)


def test_faster_than_light_is_above_one_and_flagged():
    score = sol_score(0.5, 2.0, 1.0)
    assert score > 1 and above_sol(score)
    assert not above_sol(sol_score(1.0, 2.0, 1.0))


def test_edge_case_baseline_at_or_below_sol():
    assert sol_score(1.0, 1.0, 1.0) == 1.0
    assert sol_score(0.9, 0.8, 1.0) == 1.0
    assert sol_score(1.1, 0.8, 1.0) == 0.0
    assert sol_score(float("nan"), 2.0, 1.0) == 0.0
    assert sol_score(0.0, 2.0, 1.0) == 0.0


def test_aggregates_count_failures_as_zero():
    assert problem_score([0.5, 1.0, None]) == pytest.approx(0.5)
    assert problem_score([]) == 0.0
    assert suite_score([0.6, None, 0.9, 0.5]) == pytest.approx(0.5)
    assert coefficient_of_variation([1.0, 1.0, 1.0]) == 0.0
    assert coefficient_of_variation([1.0, 3.0]) == pytest.approx(2**0.5 / 2)
    assert coefficient_of_variation([2.0]) == 0.0
