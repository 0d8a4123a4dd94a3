"""A program cannot tell its first evaluation from a re-evaluation (a noise sample, the
auditor's strict run) by the seed it is handed (``EVOLVE_SEED``, ``EvalContext.seed``).

First seeds used to be ``run_seed * 1_000_003 + seq``: the candidate's sequence number for the
default run seed, a small residue modulo 1_000_003 for any other, while extra samples drew a
hash. A program testing that could behave only when re-evaluated.
"""

from __future__ import annotations

import pytest

from evolve.archive.noise import reevaluation_seed
from evolve.search.jobs import eval_seed


def looks_like_a_first_evaluation(seed: int) -> bool:
    """The test a cheating program could make of the old seeds."""
    return seed < 1_000_000 or seed % 1_000_003 < 1_000_000 // 100


@pytest.mark.parametrize("run_seed", [0, 1, 7, 12345])
def test_first_seeds_pass_no_test_that_re_evaluation_seeds_fail(run_seed) -> None:
    first = [eval_seed(run_seed, seq) for seq in range(1, 401)]
    again = [reevaluation_seed(seed, k) for seed in first for k in (1, 2)]
    assert len(set(first)) == len(first)
    share_first = sum(map(looks_like_a_first_evaluation, first)) / len(first)
    share_again = sum(map(looks_like_a_first_evaluation, again)) / len(again)
    assert share_first < 0.05 and share_again < 0.05  # ~1% each: seeds spread over 2**31
    assert 0.4 < sum(s < 2**30 for s in first) / len(first) < 0.6
