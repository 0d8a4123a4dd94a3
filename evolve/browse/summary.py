"""Everything ``stats`` and the overview page show about a run, gathered from the read model."""

from __future__ import annotations

from typing import Any

from evolve.query import Source
from evolve.query.run import cost, counts, fitness_series, run_info, time_breakdown
from evolve.research.plots import DEFAULT_WINDOW, success_rates


def stats(source: Source, *, points: int = 20, last: int | None = DEFAULT_WINDOW) -> dict[str, Any]:
    """Run info, counts, success per operator and model (over the ``last`` candidates; None:
    all), cost, the time series and where the evaluations' time went."""
    return {
        "run": run_info(source),
        "counts": counts(source),
        "success": success_rates(source, last=last),
        "cost": cost(source),
        "series": fitness_series(source, points=points),
        "time": time_breakdown(source),
    }
