"""The training harness started ahead of its job: at most one per process, for one workdir.

``NanochatFitness.prepare_training`` starts the training harness (its program launched and
waiting: torch imported) when the local check of a candidate begins; the next
``train`` of the same workdir and context takes it, anything else ends it. A failed local
check and this process's exit end it too.
"""

from __future__ import annotations

import atexit
from pathlib import Path

from evolve.harness.fitness import EvalContext, Started

_KEPT: list[tuple[str, EvalContext, Started]] = []


def keep(workdir: Path, ctx: EvalContext, started: Started) -> None:
    """Hold ``started`` for the next ``take`` of ``workdir`` and ``ctx`` (ending any other)."""
    drop()
    _KEPT.append((str(Path(workdir).resolve()), ctx, started))


def take(workdir: Path, ctx: EvalContext) -> Started | None:
    """The harness kept for ``workdir`` and ``ctx`` while it still waits, once; else None."""
    if _KEPT and _KEPT[0][:2] == (str(Path(workdir).resolve()), ctx):
        started = _KEPT.pop()[2]
        if started.alive():
            return started
        started.cancel()
    drop()
    return None


@atexit.register
def drop() -> None:
    """End the harness kept and not taken."""
    while _KEPT:
        _KEPT.pop()[2].cancel()
