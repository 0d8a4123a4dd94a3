"""evolve: open-ended evolutionary search over programs.

The public API, for notebooks and scripts (``from evolve import ...``); importing it starts
nothing and imports no model client, torch or Hydra:

- data: ``Candidate``, ``Proposal``, ``Evaluation``, ``EvalStatus``, ``Objective``,
  ``Direction``, ``Descriptor``, ``AddStatus``, ``AddResult``, ``EvolveError``;
- the archive and its store: ``Archive``, ``Store``;
- the fitness contract: ``Fitness``, ``EvalContext``, ``Stage``, ``Benchmark``;
- settings: ``SearchSettings``, ``ArchiveSettings``, ``EmitterSettings``, ``NoiseSettings``,
  ``RunSettings``;
- running: ``run`` (a whole search, as ``python -m evolve`` runs it).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from evolve.archive import Archive
from evolve.fitness import Benchmark, EvalContext, Fitness, Stage
from evolve.noise import NoiseSettings
from evolve.settings import ArchiveSettings, EmitterSettings, RunSettings, SearchSettings
from evolve.store import Store
from evolve.types import (
    AddResult,
    AddStatus,
    Candidate,
    Descriptor,
    Direction,
    EvalStatus,
    Evaluation,
    EvolveError,
    Objective,
    Proposal,
)

if TYPE_CHECKING:
    from evolve.search import Summary

__version__ = "0.1.0"

__all__ = [
    # data
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
    # archive and store
    "Archive",
    "Store",
    # the fitness contract
    "Benchmark",
    "EvalContext",
    "Fitness",
    "Stage",
    # settings
    "ArchiveSettings",
    "EmitterSettings",
    "NoiseSettings",
    "RunSettings",
    "SearchSettings",
    # the engine and the driver (the ask/tell engine's names go here)
    # running
    "run",
]


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
