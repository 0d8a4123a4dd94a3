"""What a run shows while it goes: one log line per finished evaluation, and the progress bar."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from evolve.types import AddResult, AddStatus, Candidate, Evaluation

OUTCOMES = {
    AddStatus.NEW: "fills a new cell",
    AddStatus.IMPROVE_EXISTING: "improves its cell",
    AddStatus.NOT_ADDED: "not kept",
}


def evaluation_line(
    candidate: Candidate,
    evaluation: Evaluation,
    result: AddResult | None,
    objective: str,
    new_best: bool,
) -> str:
    """One log line per finished evaluation: which candidate, its verdict, and what the archive did."""
    source = f"{candidate.operator}/{candidate.model}" if candidate.model else candidate.operator
    wall = f"{evaluation.wall_s:.1f}" if evaluation.wall_s < 10 else f"{evaluation.wall_s:.0f}"
    head = f"#{candidate.seq} {source} (island {candidate.island}, {wall} s)"
    if not evaluation.ok:
        error = str(evaluation.artifacts.get("error") or "").strip().splitlines()
        return f"{head}: {evaluation.status}: {error[0][:200] if error else 'no error message'}"
    outcome = OUTCOMES[result.status if result else AddStatus.NOT_ADDED]
    samples = evaluation.metrics.get("fitness_n", 1)
    mean = f" (mean of {samples} seeds)" if samples > 1 else ""
    verdict = f"{objective} = {evaluation.fitness:.6g}{mean}, {outcome}"
    return f"{head}: {verdict}{', NEW BEST' if new_best else ''}: {candidate.description[:120]}"


class Progress:
    """The run's progress bar: evaluations out of the budget, best value, failures, USD spent."""

    def __init__(self, *, total: int, desc: str, enabled: bool) -> None:
        self.total = total
        self.desc = desc
        self.enabled = enabled
        self._bar: tqdm | None = None

    @contextlib.contextmanager
    def shown(self, initial: int) -> Iterator[Progress]:
        """Show the bar (log lines print above it) while the block runs."""
        with (
            logging_redirect_tqdm(),
            tqdm(
                total=self.total,
                initial=initial,
                desc=self.desc,
                disable=not self.enabled,
                dynamic_ncols=True,
            ) as bar,
        ):
            self._bar = bar
            try:
                yield self
            finally:
                self._bar = None

    def update(
        self, *, evaluated: int, best: float | None, failures: int, cost: Callable[[], float]
    ) -> None:
        if self._bar is None or self._bar.disable:
            return
        self._bar.n = evaluated
        self._bar.set_postfix(
            best=f"{best:.6g}" if best is not None else "-",
            failures=failures,
            cost=f"${cost():.2f}",
            refresh=False,
        )
        self._bar.refresh()
