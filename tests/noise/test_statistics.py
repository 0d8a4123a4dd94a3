"""The noise statistics of evolve.harness.fitness agree with scipy and behave at the edges."""

import math
import random

import pytest
from scipy import stats

from evolve.archive.statistics import (
    Samples,
    calibrate,
    improvement_pvalue,
    mean_interval,
    pooled_sd,
)
from evolve.types import EvalStatus, Evaluation


def draws(n, mean=0.0, sd=1.0, seed=0):
    rng = random.Random(seed)
    return [rng.gauss(mean, sd) for _ in range(n)]


def test_samples_summarise_like_the_textbook():
    values = draws(7, 3.0, 2.0)
    s = Samples.of(values)
    assert s.n == 7 and s.df == 6
    assert s.mean == pytest.approx(sum(values) / 7)
    assert s.sd == pytest.approx(stats.tstd(values))
    assert Samples.of([4.0]) == Samples(n=1, mean=4.0, sd=0.0)
    with pytest.raises(ValueError, match="finite"):
        Samples.of([1.0, math.nan])
    with pytest.raises(ValueError, match="at least one"):
        Samples.of([])


@pytest.mark.parametrize("seed", range(5))
def test_two_group_pvalue_equals_scipy_student_t(seed):
    a, b = draws(4, 0.3, 1.0, seed), draws(6, 0.0, 1.0, seed + 100)
    sa, sb = Samples.of(a), Samples.of(b)
    sd, df = pooled_sd([sa, sb])
    assert df == 8
    ours = improvement_pvalue(sa, sb, sd=sd, df=df)
    assert ours == pytest.approx(stats.ttest_ind(a, b, alternative="greater").pvalue, rel=1e-9)
    minimised = improvement_pvalue(sa, sb, sd=sd, df=df, maximize=False)
    assert minimised == pytest.approx(stats.ttest_ind(a, b, alternative="less").pvalue, rel=1e-9)


def test_pooling_over_a_third_group_adds_its_degrees_of_freedom():
    groups = [Samples.of(draws(5, seed=1)), Samples.of([2.0]), Samples.of(draws(3, seed=2))]
    sd, df = pooled_sd(groups)
    assert df == 4 + 0 + 2
    ss = sum(g.df * g.sd**2 for g in groups)
    assert sd == pytest.approx(math.sqrt(ss / 6))
    assert pooled_sd([Samples.of([1.0]), Samples.of([2.0])]) == (0.0, 0)


def test_zero_spread_is_plain_comparison():
    better, worse = Samples(n=1, mean=2.0), Samples(n=1, mean=1.0)
    assert improvement_pvalue(better, worse, sd=0.0, df=4) == 0.0
    assert improvement_pvalue(worse, better, sd=0.0, df=4) == 1.0
    assert improvement_pvalue(worse, worse, sd=0.0, df=4) == 1.0
    assert improvement_pvalue(worse, better, sd=0.0, df=4, maximize=False) == 0.0


def test_known_sigma_uses_the_normal_distribution():
    c, i = Samples(n=4, mean=1.0), Samples(n=4, mean=0.0)
    p = improvement_pvalue(c, i, sd=1.0, df=math.inf)
    assert p == pytest.approx(stats.norm.sf(1.0 / math.sqrt(0.5)))


def test_mean_interval_matches_scipy_and_covers_at_its_level():
    values = draws(6, 1.0, 0.5, seed=3)
    s = Samples.of(values)
    low, high = mean_interval(s, sd=s.sd, df=s.df, level=0.9)
    expected = stats.t.interval(0.9, s.df, loc=s.mean, scale=s.sd / math.sqrt(s.n))
    assert (low, high) == pytest.approx(expected)
    assert mean_interval(Samples(n=1, mean=5.0), sd=0.0, df=0) == (5.0, 5.0)
    rng = random.Random(9)
    covered = 0
    for _ in range(2000):
        s = Samples.of([rng.gauss(0.0, 1.0) for _ in range(5)])
        low, high = mean_interval(s, sd=s.sd, df=s.df, level=0.95)
        covered += low <= 0.0 <= high
    assert 0.93 < covered / 2000 < 0.97
    with pytest.raises(ValueError, match="level"):
        mean_interval(s, sd=1.0, df=3, level=1.5)


def test_calibrate_keeps_the_fitness_and_every_numeric_metric():
    evals = [
        Evaluation(
            status=EvalStatus.OK,
            fitness=f,
            metrics={"loss": f + 1, "name": 3, "flag": True, "nan": math.nan},
        )
        for f in (1.0, 2.0, 4.0)
    ]
    out = calibrate(evals)
    assert set(out) == {"fitness", "loss", "name"}
    assert out["fitness"].mean == pytest.approx(7 / 3) and out["loss"].sd == pytest.approx(
        out["fitness"].sd
    )
    with pytest.raises(ValueError, match="all of them OK"):
        calibrate([Evaluation(status=EvalStatus.ERROR)])
