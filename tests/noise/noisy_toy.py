"""A noisy variant of the toy fitness: the toy's score plus Gaussian noise drawn from the evaluation seed."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

from evolve.harness.fitness import EvalContext
from evolve.types import Evaluation
from tests.fixtures.toy import Toy


class NoisyToy(Toy):
    """The toy's score + N(0, sigma^2), reproducible per seed (``sigma`` 0 gives the toy itself)."""

    def __init__(
        self, *, sigma: float = 1.0, sleep_s: float = 0.0, fail_seed: bool = False
    ) -> None:
        super().__init__(sleep_s=sleep_s, fail_seed=fail_seed)
        self.sigma = sigma

    def evaluate(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        evaluation = super().evaluate(workdir, ctx)
        if not evaluation.ok:
            return evaluation
        score = evaluation.fitness + random.Random(ctx.seed).gauss(0.0, self.sigma)
        return replace(evaluation, fitness=score, metrics={**evaluation.metrics, "score": score})
