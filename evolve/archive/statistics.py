"""The statistics of noisy scores: repeated samples, pooled spread, one-sided t-tests, intervals.

Noise-aware selection (``evolve.archive.noise``) and the referee judge challengers with them;
a benchmark may test a score against a target (``one_sided_pvalue``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from evolve.harness import phases
from evolve.types import Evaluation


def one_sided_pvalue(
    samples: Sequence[float], threshold: float, *, alternative: str = "less"
) -> float:
    """p-value of a one-sample t-test that the mean of ``samples`` is below (or above) ``threshold``.

    Matches ``scipy.stats.ttest_1samp(samples, threshold, alternative=...).pvalue``; a
    single sample or zero spread gives 0.0 or 1.0 by which side of the threshold it is.
    """
    from scipy import stats

    values = [float(v) for v in samples]
    if len(values) < 2 or max(values) == min(values):
        mean = sum(values) / len(values)
        below = mean < threshold if alternative == "less" else mean > threshold
        return 0.0 if below else 1.0
    pvalue = float(stats.ttest_1samp(values, threshold, alternative=alternative).pvalue)
    return pvalue if math.isfinite(pvalue) else 1.0


# --- noise statistics ---------------------------------------------------------------------------
#
# Repeated evaluations of one program with different seeds scatter around its true value.
# Selection compares a challenger's samples with an incumbent's by a one-sided two-sample
# t-test whose spread is pooled over every group measured so far (the seed program's
# calibration runs, the incumbent's and the challenger's own runs), assuming one common
# spread. With that assumption the statistic follows Student's t with the pooled degrees
# of freedom exactly (Student 1908; e.g. scipy.stats.ttest_ind with equal_var=True).


@dataclass(frozen=True)
class Samples:
    """Repeated measurements of one quantity, summarised: count, mean and sample standard deviation.

    Attributes:
        n: number of measurements (>= 1).
        mean: their mean.
        sd: their sample standard deviation (ddof=1); 0.0 when ``n`` is 1.
    """

    n: int
    mean: float
    sd: float = 0.0

    @classmethod
    def of(cls, values: Sequence[float]) -> Samples:
        """Summarise ``values`` (at least one, all finite)."""
        data = [float(v) for v in values]
        if not data or not all(math.isfinite(v) for v in data):
            raise ValueError(f"Samples.of needs at least one finite value, got {data!r}")
        mean = math.fsum(data) / len(data)
        if len(data) < 2:
            return cls(n=1, mean=mean, sd=0.0)
        var = math.fsum((v - mean) ** 2 for v in data) / (len(data) - 1)
        return cls(n=len(data), mean=mean, sd=math.sqrt(var))

    @property
    def df(self) -> int:
        """Degrees of freedom of the spread: n - 1."""
        return self.n - 1


def pooled_sd(groups: Sequence[Samples]) -> tuple[float, int]:
    """The standard deviation pooled over groups that share one spread, and its degrees of freedom.

    Each group contributes ``(n - 1) * sd**2`` to the sum of squares and ``n - 1`` degrees of
    freedom; groups of one measurement contribute nothing. Returns (0.0, 0) when no group
    has two measurements.
    """
    df = sum(g.df for g in groups)
    if df == 0:
        return 0.0, 0
    return math.sqrt(math.fsum(g.df * g.sd**2 for g in groups) / df), df


def improvement_pvalue(
    challenger: Samples, incumbent: Samples, *, sd: float, df: float, maximize: bool = True
) -> float:
    """One-sided p-value that the challenger's true mean is better than the incumbent's.

    The two-sample t statistic ``(mean_c - mean_i) / (sd * sqrt(1/n_c + 1/n_i))`` (sign
    flipped when minimising) against Student's t with ``df`` degrees of freedom (the normal
    distribution when ``df`` is infinite). With ``sd`` pooled over exactly the two groups
    this equals ``scipy.stats.ttest_ind(c, i, alternative='greater').pvalue``. A zero spread
    (a deterministic fitness) or no degrees of freedom gives 0.0 when the challenger is
    strictly better and 1.0 otherwise, which is plain comparison.
    """
    from scipy import stats

    diff = challenger.mean - incumbent.mean
    if not maximize:
        diff = -diff
    if sd <= 0 or df <= 0:
        return 0.0 if diff > 0 else 1.0
    t = diff / (sd * math.sqrt(1 / challenger.n + 1 / incumbent.n))
    pvalue = float(stats.norm.sf(t) if math.isinf(df) else stats.t.sf(t, df))
    return pvalue if math.isfinite(pvalue) else 1.0


def mean_interval(
    samples: Samples, *, sd: float, df: float, level: float = 0.95
) -> tuple[float, float]:
    """Two-sided confidence interval of the true mean behind ``samples`` at ``level``.

    ``mean -/+ q * sd / sqrt(n)`` with ``q`` the Student-t quantile (normal when ``df`` is
    infinite); a zero spread or no degrees of freedom gives the point interval (mean, mean).
    """
    from scipy import stats

    if not 0 < level < 1:
        raise ValueError(f"confidence level must lie in (0, 1), got {level}")
    if sd <= 0 or df <= 0:
        return samples.mean, samples.mean
    tail = (1 + level) / 2
    q = float(stats.norm.ppf(tail) if math.isinf(df) else stats.t.ppf(tail, df))
    half = q * sd / math.sqrt(samples.n)
    return samples.mean - half, samples.mean + half


def calibrate(evaluations: Sequence[Evaluation]) -> dict[str, Samples]:
    """Per-metric spread of one program evaluated with several seeds.

    Returns ``Samples`` for the fitness (key ``"fitness"``) and for every metric that is a
    finite number in all ``evaluations`` (all of which must be OK), except where the
    evaluations' time went (``time_<phase>``: the machine's, not the program's).
    """
    if not evaluations or not all(e.ok for e in evaluations):
        raise ValueError("calibrate needs at least one evaluation, all of them OK")
    values: dict[str, list[float]] = {"fitness": [float(e.fitness) for e in evaluations]}  # type: ignore[arg-type]
    names = {
        n
        for n in set.intersection(*(set(e.metrics) for e in evaluations))
        if not phases.is_phase(n)
    }
    for name in sorted(names):
        column = [e.metrics[name] for e in evaluations]
        if all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            for v in column
        ):
            values[name] = [float(v) for v in column]
    return {name: Samples.of(column) for name, column in values.items()}
