"""Noise-aware selection: calibrate the seed's spread over seeds, re-evaluate close challengers, judge.

At run start the seed program is evaluated with ``NoiseSettings.seeds`` different seeds;
their spread (per metric) is the run's calibration, kept in the ``state`` table under
``noise``. A challenger that lands in an occupied cell is compared with the incumbent by a
one-sided two-sample t-test (``evolve.archive.statistics.improvement_pvalue``) whose spread is pooled
over the calibration and both candidates' own samples. The challenger is evaluated with
more seeds when the result is close (``schedule``: sample counts at each look), and it
replaces the incumbent only when significant at its look's share of ``alpha`` (shares
proportional to the looks' sample counts and summing to ``alpha``: a Bonferroni split, so
the chance that a challenger no better than the incumbent is promoted stays below
``alpha`` under the normal, common-spread model; ``scripts/noise_simulation.py`` measures
it).

Storage: each extra sample is a row of the evaluations table with stage ``reevaluation``;
the candidate's verdict row is written last and holds the mean over all samples as its
fitness, every seed, and in ``metrics`` the keys ``fitness_n``, ``fitness_mean``,
``fitness_sd``, ``fitness_ci_low``, ``fitness_ci_high`` (and ``fitness_pvalue`` when it was
compared with an incumbent). With ``seeds: 1`` none of this runs.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from evolve.archive.statistics import (
    Samples,
    calibrate,
    improvement_pvalue,
    mean_interval,
    pooled_sd,
)
from evolve.harness import phases
from evolve.settings import NoiseSettings
from evolve.store.database import Store
from evolve.types import Direction, Evaluation, Objective

REEVALUATION = "reevaluation"
STATE_KEY = "noise"


def reevaluation_seed(base: int, k: int) -> int:
    """The evaluation seed of sample ``k`` (k >= 1) of a candidate whose first seed is ``base``."""
    digest = hashlib.sha256(f"{base}:{k}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % (2**31)


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """The seed program's spread over seeds: the run's measure of noise.

    Attributes:
        seed_id: the seed program's candidate id.
        seeds: the evaluation seeds used.
        metrics: ``Samples`` per metric; ``"fitness"`` is the objective.
    """

    seed_id: str
    seeds: tuple[int, ...]
    metrics: Mapping[str, Samples]

    @property
    def fitness(self) -> Samples:
        return self.metrics["fitness"]

    def sigma(self, name: str = "fitness") -> float:
        """The calibrated standard deviation of a metric."""
        return self.metrics[name].sd

    def to_json(self) -> dict[str, Any]:
        return {
            "seed_id": self.seed_id,
            "seeds": list(self.seeds),
            "n": len(self.seeds),
            "sigma": {k: v.sd for k, v in self.metrics.items()},
            "mean": {k: v.mean for k, v in self.metrics.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Calibration:
        n = int(data["n"])
        metrics = {
            k: Samples(n=n, mean=float(data["mean"][k]), sd=float(sd))
            for k, sd in data["sigma"].items()
        }
        return cls(seed_id=data["seed_id"], seeds=tuple(data["seeds"]), metrics=metrics)


def stored_samples(evaluation: Evaluation) -> Samples:
    """The fitness samples summarised in a verdict row (one sample when it carries no statistics)."""
    assert evaluation.fitness is not None
    metrics = evaluation.metrics
    return Samples(
        n=int(metrics.get("fitness_n", 1)),
        mean=float(evaluation.fitness),
        sd=float(metrics.get("fitness_sd", 0.0)),
    )


def pvalue(
    challenger: Samples,
    incumbent: Samples,
    *,
    calibration: Calibration,
    incumbent_is_seed: bool,
    objective: Objective,
) -> float:
    """One-sided p-value that ``challenger`` beats ``incumbent``, spread pooled with the calibration.

    When the incumbent is the seed program its samples are the calibration's, counted once.
    """
    groups = [calibration.fitness, challenger]
    if not incumbent_is_seed:
        groups.append(incumbent)
    sd, df = pooled_sd(groups)
    return improvement_pvalue(
        challenger,
        incumbent,
        sd=sd,
        df=df,
        maximize=objective.direction == Direction.MAXIMIZE,
    )


def next_count(n: int, p: float, settings: NoiseSettings) -> int | None:
    """How many samples the challenger should have before the next look; None when decided.

    Decided: significant (``p < look_alpha(n)``: promote), not close (``p >= close``:
    refuse), or the schedule is exhausted (refuse).
    """
    if p < settings.look_alpha(n) or p >= settings.close:
        return None
    return next((count for count in settings.schedule if count > n), None)


def summarize(
    samples: Sequence[Evaluation],
    *,
    calibration: Calibration,
    settings: NoiseSettings,
    own_calibration: bool = False,
    p: float | None = None,
) -> Evaluation:
    """The verdict row of a candidate evaluated ``len(samples)`` times.

    OK samples give the first sample's evaluation with the mean fitness, every seed, the
    summed wall time and the statistics in ``metrics``. A sample after the first that
    failed makes the verdict that failure (a program must pass with every seed).
    ``own_calibration``: the samples are the calibration itself (the seed program).
    """
    first = samples[0]
    seeds = tuple(s for sample in samples for s in sample.seeds)
    wall = math.fsum(sample.wall_s for sample in samples)
    if not first.ok:
        return first
    failed = next(((k, s) for k, s in enumerate(samples) if not s.ok), None)
    if failed is not None:
        k, sample = failed
        error = sample.artifacts.get("error", str(sample.status))
        return replace(
            sample,
            fitness=None,
            metrics={
                **first.metrics,
                **sample.metrics,
                **phases.summed(s.metrics for s in samples),
            },
            artifacts={
                **sample.artifacts,
                "error": f"re-evaluation {k} with seed {sample.seeds} failed ({sample.status}): {error}; "
                f"the first evaluation was OK with fitness {first.fitness}. A program must pass with every seed",
            },
            stage=first.stage,
            seeds=seeds,
            wall_s=wall,
        )
    stats = Samples.of([float(s.fitness) for s in samples])  # type: ignore[arg-type]
    groups = [stats] if own_calibration else [calibration.fitness, stats]
    sd, df = pooled_sd(groups)
    low, high = mean_interval(stats, sd=sd, df=df, level=settings.level)
    metrics = {
        **first.metrics,
        "fitness_n": stats.n,
        "fitness_mean": stats.mean,
        "fitness_sd": stats.sd,
        "fitness_ci_low": low,
        "fitness_ci_high": high,
        **phases.summed(s.metrics for s in samples),  # their wall time is summed too
    }
    if p is not None:
        metrics["fitness_pvalue"] = p
    return replace(first, fitness=stats.mean, metrics=metrics, seeds=seeds, wall_s=wall)


class NoiseJudge:
    """The archive's test of a challenger against an incumbent elite (``Archive.judge``).

    Args:
        store: the run's store (incumbents' verdict rows are read from it).
        objective: what is optimised.
        calibration: the run's calibration.
        settings: the noise settings.
    """

    def __init__(
        self,
        *,
        store: Store,
        objective: Objective,
        calibration: Calibration,
        settings: NoiseSettings,
    ) -> None:
        self.store = store
        self.objective = objective
        self.calibration = calibration
        self.settings = settings

    def incumbent_samples(self, candidate_id: str, value: float) -> Samples:
        """The incumbent's samples; its mean is the elite's value."""
        evaluation = self.store.evaluation(candidate_id)
        stored = (
            stored_samples(evaluation) if evaluation and evaluation.ok else Samples(n=1, mean=value)
        )
        return replace(stored, mean=value)

    def pvalue(self, challenger: Samples, incumbent_id: str, value: float) -> float:
        """One-sided p-value that ``challenger`` beats the incumbent elite ``incumbent_id``."""
        return pvalue(
            challenger,
            self.incumbent_samples(incumbent_id, value),
            calibration=self.calibration,
            incumbent_is_seed=incumbent_id == self.calibration.seed_id,
            objective=self.objective,
        )

    def __call__(self, challenger: Evaluation, incumbent_id: str, value: float) -> bool:
        """True when the challenger is better than the incumbent beyond noise."""
        samples = stored_samples(challenger)
        return self.pvalue(samples, incumbent_id, value) < self.settings.look_alpha(samples.n)


def repeated(store: Store) -> dict[str, Samples]:
    """Every program evaluated more than once: its verdict's samples (n, mean, sd), by candidate id."""
    rows = store.conn.execute(
        "SELECT candidate, fitness, json_extract(metrics, '$.fitness_n'), "
        "json_extract(metrics, '$.fitness_sd') FROM evaluations WHERE status = 'ok' "
        f"AND stage NOT IN ('{REEVALUATION}', 'strict') AND json_extract(metrics, '$.fitness_n') > 1"
    )
    return {cid: Samples(n=int(n), mean=float(mean), sd=float(sd)) for cid, mean, n, sd in rows}


def reevaluations(store: Store, candidate_id: str) -> list[Evaluation]:
    """The candidate's stored re-evaluation rows, oldest first."""
    return store.evaluations_at(candidate_id, REEVALUATION)


def make_calibration(seed_id: str, samples: Sequence[Evaluation]) -> Calibration:
    """The calibration from the seed program's OK evaluations (one per seed)."""
    return Calibration(
        seed_id=seed_id,
        seeds=tuple(s for sample in samples for s in sample.seeds),
        metrics=calibrate(samples),
    )
