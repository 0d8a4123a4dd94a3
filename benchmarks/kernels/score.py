"""The SOL score and its aggregates (SOL-ExecBench; BENCHMARKS.md section 3).

``S = 1 / (1 + (T_k - T_SOL) / (T_b - T_SOL))``: 0.5 at the baseline T_b, 1.0 at the speed
of light T_SOL, towards 0 for slow kernels. When ``T_b <= T_SOL`` the formula has no room:
S = 1 if ``T_k <= T_SOL`` else 0. A score above 1 (faster than the roofline) means the
bound or the timing is wrong, and is flagged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def sol_score(t_kernel: float, t_baseline: float, t_sol: float) -> float:
    """The SOL score of a kernel time against a baseline time and the speed-of-light time."""
    if not all(math.isfinite(t) for t in (t_kernel, t_baseline, t_sol)) or t_kernel <= 0:
        return 0.0
    if t_baseline <= t_sol:
        return 1.0 if t_kernel <= t_sol else 0.0
    return 1.0 / (1.0 + (t_kernel - t_sol) / (t_baseline - t_sol))


def above_sol(score: float) -> bool:
    """True when a score exceeds 1: the roofline or the measurement cannot be right."""
    return score > 1.0 + 1e-9


def problem_score(workload_scores: Sequence[float | None]) -> float:
    """Mean over workloads; a failed workload (None) counts 0."""
    if not workload_scores:
        return 0.0
    return sum(s or 0.0 for s in workload_scores) / len(workload_scores)


def suite_score(problem_scores: Iterable[float | None]) -> float:
    """Mean over problems; a failed problem (None) counts 0."""
    values = [s or 0.0 for s in problem_scores]
    return sum(values) / len(values) if values else 0.0


def coefficient_of_variation(values: Sequence[float]) -> float:
    """Sample standard deviation over mean (0 for fewer than two values)."""
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return math.sqrt(var) / mean if mean else 0.0
