"""One writer per run directory: an exclusive lock that a run holds for as long as it runs.

SQLite keeps each transaction atomic, but two searches writing one archive would still
interleave their candidates (duplicate sequence numbers, a candidate evaluated twice). The
lock is advisory (``flock`` on ``RUN_DIR/.lock``), so readers such as ``evolve.browse`` are
never blocked, and the kernel releases it when the process dies, even by SIGKILL.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import time
from collections.abc import Iterator
from pathlib import Path

from evolve.types import EvolveError

LOCK_NAME = ".lock"


class RunDirectoryBusy(EvolveError):
    """Another process is running a search in this run directory."""


@contextlib.contextmanager
def hold(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir``'s writer lock for the duration of the block, or raise RunDirectoryBusy."""
    path = Path(run_dir) / LOCK_NAME
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            raise _busy(run_dir, handle.read()) from None
        handle.seek(0)
        handle.truncate()
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        handle.write(f"evolve pid {os.getpid()} on {platform.node()}, since {started}\n")
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            fcntl.flock(handle, fcntl.LOCK_UN)


def _busy(run_dir: Path, holder: str) -> RunDirectoryBusy:
    return RunDirectoryBusy(
        f"{run_dir} is in use by {holder.strip() or 'another process'}; wait for that run to end "
        "(or stop it), then resume it, or start this run in another directory (hydra.run.dir=...)"
    )


def check_free(run_dir: Path) -> None:
    """Raise RunDirectoryBusy when a live process holds ``run_dir``'s lock; takes no lock."""
    if held(run_dir):
        raise _busy(run_dir, (Path(run_dir) / LOCK_NAME).read_text())


def held(run_dir: Path) -> bool:
    """Whether a live process holds ``run_dir``'s writer lock (read from ``/proc/locks``, so
    asking takes no lock: a run starting at that moment is never refused because of it)."""
    try:
        inode = (Path(run_dir) / LOCK_NAME).stat().st_ino
        table = Path("/proc/locks").read_text()
    except OSError:
        return False
    for line in table.splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5].rsplit(":", 1)[-1] == str(inode):
            return True
    return False
