"""The significance decision: the one-sided t-test at p < alpha, its boundary, and the verdict."""

from __future__ import annotations

import math

import pytest
from evolve.benchmarks.speedrun.fitness import SpeedrunFitness, decide
from evolve.benchmarks.speedrun.runner import RunRecord
from scipy import stats

from evolve.types import EvalStatus

TARGET, ALPHA = 3.28, 0.01


def _samples_with_pvalue(p: float, n: int = 3, sd: float = 0.002) -> list[float]:
    """n losses with sample sd ``sd`` whose one-sided p-value against TARGET is exactly ``p``."""
    t = stats.t.ppf(p, n - 1)
    mean = TARGET + t * sd / math.sqrt(n)
    offsets = [-1.0, 0.0, 1.0] if n == 3 else [(i - (n - 1) / 2) for i in range(n)]
    scale = sd / stats.tstd(offsets)
    return [mean + o * scale for o in offsets]


def test_clearly_below_passes_and_matches_scipy():
    losses = [3.270, 3.272, 3.271, 3.269]
    passed, p = decide(losses, TARGET, ALPHA)
    assert passed
    assert p == pytest.approx(stats.ttest_1samp(losses, TARGET, alternative="less").pvalue)


def test_above_the_target_fails():
    passed, p = decide([3.29, 3.30, 3.285], TARGET, ALPHA)
    assert not passed and p > 0.5


def test_below_on_average_but_too_noisy_fails():
    passed, p = decide([3.20, 3.35, 3.25], TARGET, ALPHA)  # mean 3.267 < 3.28, spread too large
    assert not passed and 0.01 < p < 0.5


def test_boundary_just_below_alpha_passes_and_just_above_fails():
    below = _samples_with_pvalue(ALPHA * 0.999)
    above = _samples_with_pvalue(ALPHA * 1.001)
    assert decide(below, TARGET, ALPHA)[0]
    assert not decide(above, TARGET, ALPHA)[0]
    assert stats.ttest_1samp(below, TARGET, alternative="less").pvalue == pytest.approx(
        ALPHA * 0.999, rel=1e-6
    )


def test_a_pvalue_equal_to_alpha_fails():
    losses = _samples_with_pvalue(ALPHA)
    alpha = p_of(losses)  # exactly this sample's p-value, whatever rounding did
    passed, p = decide(losses, TARGET, alpha)
    assert p == alpha and not passed


def p_of(losses: list[float]) -> float:
    return float(stats.ttest_1samp(losses, TARGET, alternative="less").pvalue)


def test_a_single_seed_passes_only_below_the_target():
    assert decide([3.2], TARGET, ALPHA) == (True, 0.0)
    assert decide([3.3], TARGET, ALPHA) == (False, 1.0)


def _fitness(n_seeds: int = 3) -> SpeedrunFitness:
    return SpeedrunFitness(
        preset="cpu", target=TARGET, data_dir="unused", val_tokens=1024, n_seeds=n_seeds
    )


def _record(seed: int, loss: float, time_s: float) -> RunRecord:
    return RunRecord(
        seed=seed,
        status=EvalStatus.OK,
        train_s=time_s,
        loss=loss,
        init_loss=10.8,
        untimed_s=5.0,
        eval_s=2.0,
        wall_s=time_s + 9.0,
        params=124_000_000,
    )


def test_verdict_ok_gives_mean_time_as_fitness():
    evaluation = _fitness().verdict(
        [_record(0, 3.270, 100.0), _record(1, 3.271, 110.0), _record(2, 3.269, 90.0)]
    )
    assert evaluation.status == EvalStatus.OK
    assert evaluation.fitness == pytest.approx(100.0)
    assert evaluation.metrics["pvalue"] < ALPHA
    assert evaluation.metrics["overhead_mean_s"] == pytest.approx(9.0)
    assert evaluation.descriptors["params_m"] == pytest.approx(124.0)


def test_verdict_invalid_keeps_pvalue_and_every_loss():
    losses = [3.275, 3.285, 3.279]
    evaluation = _fitness().verdict([_record(i, loss, 100.0) for i, loss in enumerate(losses)])
    assert evaluation.status == EvalStatus.INVALID and evaluation.fitness is None
    assert [evaluation.metrics[f"loss_{i}"] for i in range(3)] == losses
    assert evaluation.metrics["pvalue"] == pytest.approx(p_of(losses))
    assert "not below the target 3.28 at p < 0.01" in evaluation.artifacts["error"]


def test_verdict_of_a_failed_run_carries_its_status_and_reason():
    bad = RunRecord(seed=1, status=EvalStatus.REJECTED, reason="the clock was paused")
    evaluation = _fitness().verdict([_record(0, 3.27, 100.0), bad])
    assert evaluation.status == EvalStatus.REJECTED
    assert evaluation.artifacts["error"] == "seed 1: the clock was paused"
    assert evaluation.metrics["loss_0"] == 3.27
