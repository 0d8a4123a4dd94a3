"""Paths that no sandboxed command may read, named once for a process and the workers it starts.

A run's directory is one: its archive holds every earlier candidate's code and evaluations
(output included), so a candidate that read it could resume from an earlier evaluation's work.
The paths travel in an environment variable, so that worker processes started inside
``hidden`` inherit them; the sandbox adds them to every ``Policy.hidden`` and never passes the
variable on to the command.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

VAR = "EVOLVE_UNREADABLE"


def paths() -> tuple[str, ...]:
    """The paths named for this process."""
    return tuple(p for p in os.environ.get(VAR, "").split(os.pathsep) if p)


@contextlib.contextmanager
def hidden(*more: Path) -> Iterator[None]:
    """Within the block, ``more`` is unreadable to the commands sandboxed by this process and
    by the worker processes it starts."""
    before = os.environ.get(VAR)
    os.environ[VAR] = os.pathsep.join([*paths(), *(str(Path(p).resolve()) for p in more)])
    try:
        yield
    finally:
        if before is None:
            del os.environ[VAR]
        else:
            os.environ[VAR] = before
