"""evolve: open-ended evolutionary search over programs.

The public API, for notebooks and scripts (``from evolve import ...``). Importing the package
starts nothing and imports none of its modules but ``evolve.exports``; each name below
loads its own module on first use:

- data: ``Candidate``, ``Proposal``, ``Evaluation``, ``EvalStatus``, ``Objective``,
  ``Direction``, ``Descriptor``, ``AddStatus``, ``AddResult``, ``EvolveError``;
- the archive and its store: ``Archive``, ``Store``;
- the fitness contract: ``Fitness``, ``EvalContext``, ``Stage``, ``Benchmark``;
- settings: ``SearchSettings``, ``ArchiveSettings``, ``EmitterSettings``, ``NoiseSettings``,
  ``AuditSettings``, ``RunSettings``;
- the engine: ``Engine`` (ask/tell), ``Emitter``, ``Driver`` (many proposals in flight),
  ``Summary``;
- running: ``run`` (a whole search, as ``python -m evolve`` runs it).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from evolve.exports import lazy

if TYPE_CHECKING:
    from evolve.search.driver import Summary

__version__ = "0.1.0"


# where each public name lives; ``from evolve import X`` imports only X's module
_HOMES = {
    **dict.fromkeys(
        (
            "AddResult",
            "AddStatus",
            "Candidate",
            "Descriptor",
            "Direction",
            "EvalStatus",
            "Evaluation",
            "EvolveError",
            "Objective",
            "Proposal",
        ),
        "evolve.types",
    ),
    "Archive": "evolve.archive.grid",
    "Store": "evolve.store.database",
    **dict.fromkeys(("Benchmark", "EvalContext", "Fitness", "Stage"), "evolve.harness.fitness"),
    **dict.fromkeys(
        (
            "ArchiveSettings",
            "AuditSettings",
            "EmitterSettings",
            "NoiseSettings",
            "RunSettings",
            "SearchSettings",
        ),
        "evolve.settings",
    ),
    # the ask/tell engine and the driver that keeps proposals in flight
    "Engine": "evolve.search.engine",
    **dict.fromkeys(("Driver", "Summary"), "evolve.search.driver"),
    "Emitter": "evolve.search.emitters",
}
_NAMES, __getattr__, __dir__ = lazy(__name__, _HOMES)
__all__ = [*_NAMES, "run"]  # the public API: every name above, and ``run``


def run(overrides: Sequence[str] = (), *, run_dir: Path | str | None = None) -> Summary:
    """Run a search as ``python -m evolve OVERRIDES`` would; returns how it ended.

    Args:
        overrides: Hydra overrides, e.g. ``["benchmark=circle_packing", "search.max_candidates=50"]``.
        run_dir: where the run is written (default ``archives/<benchmark>/<time>``).

    Raises:
        EvolveError: the run cannot start or stopped on an error; the message names the fix.
    """
    from evolve.cli import run as run_search  # Hydra, the operators and the loop load here

    return run_search(overrides, run_dir=run_dir)
