"""The harness of the Shell sort example: it sorts hidden lists with the candidate's gaps and counts comparisons."""

from __future__ import annotations

import json
import random
import secrets
import sys
from pathlib import Path

from evolve.harness.fitness import EvalContext, Limits, run_sandboxed, sandbox_failure
from evolve.types import Descriptor, Direction, EvalStatus, Evaluation, Objective


def shell_sort(items: list[float], gaps: list[int]) -> int:
    """Sort ``items`` in place with Shell sort over ``gaps``; returns the comparisons made."""
    comparisons = 0
    for gap in gaps:
        for i in range(gap, len(items)):
            value, j = items[i], i
            while j >= gap:
                comparisons += 1
                if items[j - gap] <= value:
                    break
                items[j] = items[j - gap]
                j -= gap
            items[j] = value
    return comparisons


def parse_gaps(text: str, size: int) -> list[int]:
    """The candidate's printed gaps, checked: a JSON list of decreasing integers in [1, size) ending in 1."""
    gaps = json.loads(text)
    if not isinstance(gaps, list) or not 1 <= len(gaps) <= 64:
        raise ValueError("print a JSON list of 1 to 64 gaps")
    if not all(type(g) is int and 1 <= g < size for g in gaps):
        raise ValueError(f"every gap must be an integer from 1 to {size - 1}")
    if any(a <= b for a, b in zip(gaps, gaps[1:], strict=False)) or gaps[-1] != 1:
        raise ValueError("gaps must decrease strictly and end with 1")
    return gaps


class ShellSortGaps:
    """Minimise Shell sort's comparisons per item on random lists the candidate never sees."""

    objective = Objective(name="comparisons", direction=Direction.MINIMIZE)
    descriptors = (
        Descriptor(name="gaps", low=0, high=24, bins=6),  # how many passes
        Descriptor(name="first", low=0.0, high=1.0, bins=5),  # the first gap, as a fraction of N
    )

    def __init__(self, size: int = 2000, lists: int = 3) -> None:
        self.size = size
        self.lists = lists
        self.secret = secrets.token_hex(16)  # made once per run, in the harness only

    def hidden_lists(self, seed: int) -> list[list[float]]:
        """The lists one evaluation sorts, from its seed and the secret: the candidate is told the
        seed (``EVOLVE_SEED``), so lists from the seed alone would let it tune its gaps to them."""
        rng = random.Random(f"{self.secret}:{seed}")
        return [[rng.random() for _ in range(self.size)] for _ in range(self.lists)]

    def evaluate(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        result = run_sandboxed(
            [sys.executable, "gaps.py", str(self.size)],
            cwd=workdir,
            limits=Limits(timeout_s=ctx.timeout_s),
            env=ctx.env(),
        )
        if (failure := sandbox_failure(result)) is not None:
            return failure
        try:
            gaps = parse_gaps(result.stdout, self.size)
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            return Evaluation(status=EvalStatus.INVALID, artifacts={"error": str(exc)})
        counted = 0
        for items in self.hidden_lists(ctx.seed):
            counted += shell_sort(items, gaps)
            if items != sorted(items):  # gaps ending in 1 always sort; the harness checks anyway
                return Evaluation(status=EvalStatus.INVALID, artifacts={"error": "not sorted"})
        per_item = counted / (self.lists * self.size)
        return Evaluation(
            status=EvalStatus.OK,
            fitness=per_item,
            descriptors={"gaps": len(gaps), "first": gaps[0] / self.size},
            metrics={"comparisons_per_item": per_item, "gaps": len(gaps)},
        )
