"""When a streak of rejected proposals ends a run: too many in a row, or an answer repeating stored code."""

from __future__ import annotations

from evolve.search.emitters import Ask
from evolve.search.rejections import CONVERGED_AFTER, MAX_IN_A_ROW, Rejection, Streak

ASK = Ask(seq=1, island=0, arm="diff@m", parents=(("p", None),))


def rejection(
    model: str | None = "m", duplicate_of: str | None = None, prompt: str = "h"
) -> Rejection:
    return Rejection(
        ask=ASK,
        operator="diff",
        model=model,
        reason="the answer has no SEARCH/REPLACE block",
        duplicate_of=duplicate_of,
        prompt_hash=prompt,
    )


def test_a_run_ends_after_too_many_rejections_in_a_row_naming_the_last_reason() -> None:
    streak = Streak()
    assert [streak.rejected(rejection()) for _ in range(MAX_IN_A_ROW - 1)] == [None] * (
        MAX_IN_A_ROW - 1
    )
    reason = streak.rejected(rejection())
    assert reason is not None and f"{MAX_IN_A_ROW} proposals in a row" in reason
    assert "no SEARCH/REPLACE block" in reason and "<run directory> stats" in reason


def test_an_admitted_candidate_breaks_the_streak() -> None:
    streak = Streak()
    for _ in range(MAX_IN_A_ROW - 1):
        streak.rejected(rejection())
    streak.admitted()
    assert streak.rejected(rejection()) is None


def test_answers_repeating_stored_code_to_different_prompts_mean_converged() -> None:
    streak = Streak()
    same_prompt = [streak.rejected(rejection(duplicate_of="c", prompt="h")) for _ in range(30)]
    assert same_prompt == [None] * 30  # one prompt answered alike is not convergence
    reasons = [
        streak.rejected(rejection(duplicate_of="c", prompt=f"p{i}"))
        for i in range(1, CONVERGED_AFTER)
    ]
    assert reasons[:-1] == [None] * (CONVERGED_AFTER - 2)
    assert reasons[-1] is not None and "converged" in reasons[-1]


def test_a_builtin_operator_that_redraws_only_stored_code_has_converged() -> None:
    reason = Streak().rejected(rejection(model=None, duplicate_of="c"))
    assert reason is not None and "(operator diff); the search has converged" in reason
