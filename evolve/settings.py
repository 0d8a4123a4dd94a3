"""Typed settings of a run, built once from the config and passed down to the modules that use them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class SearchSettings:
    """Budgets and concurrency of one run (the ``search`` config group).

    ``max_wall_s`` counts proposing time: from the seed program's verdict (its evaluation and
    noise calibration are not counted), and anew on each resume; evaluations in flight when it
    runs out still finish. ``max_proposals_in_flight`` bounds the proposals (LLM calls) made at
    once; None means evaluation slots + ``lookahead``.
    """

    max_candidates: int = 100
    max_wall_s: float | None = None
    lookahead: int = 0
    seed: int = 0
    migration_interval: int = 25
    progress: bool = True
    max_proposals_in_flight: int | None = None

    def proposals_in_flight(self, slots: int) -> int:
        """How many proposals may run at once with ``slots`` evaluation slots."""
        return self.max_proposals_in_flight or slots + self.lookahead

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.max_candidates, int) or self.max_candidates < 1:
            problems.append(
                f"search.max_candidates must be a positive integer, got {self.max_candidates!r}"
            )
        if self.max_wall_s is not None and not self.max_wall_s > 0:
            problems.append(
                f"search.max_wall_s must be positive seconds or null, got {self.max_wall_s!r}"
            )
        if not isinstance(self.lookahead, int) or self.lookahead < 0:
            problems.append(
                f"search.lookahead must be 0 or a positive integer, got {self.lookahead!r}"
            )
        if self.max_proposals_in_flight is not None and (
            not isinstance(self.max_proposals_in_flight, int) or self.max_proposals_in_flight < 1
        ):
            problems.append(
                "search.max_proposals_in_flight must be a positive integer or null (slots + lookahead), "
                f"got {self.max_proposals_in_flight!r}"
            )
        if not isinstance(self.migration_interval, int) or self.migration_interval < 0:
            problems.append(
                f"search.migration_interval must be 0 (no migration) or a positive integer, got {self.migration_interval!r}"
            )
        if problems:
            raise ValueError("; ".join(problems))
