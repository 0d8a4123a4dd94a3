"""Adopting the processes a sandboxed command orphans, so that their CPU time is counted.

``RUSAGE_CHILDREN`` holds the CPU time of the children this process waited for, each with
the time of the descendants it waited for. A descendant whose parent exits first (a double
fork) is re-parented to the nearest child subreaper, else to init, which reaps it: its CPU
time never reaches the harness. Within ``adopted``, this process is a subreaper: such orphans
become its children, and at the block's end (the sandbox has killed them all) it waits for
each, adding their time, and stops adopting. Children it had before the block are left to
whoever started them, so a caller (a test run, a notebook) keeps its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import time
from collections.abc import Iterator

PR_SET_CHILD_SUBREAPER = 36
REAP_WAIT_S = (
    5.0  # a killed orphan is a zombie within milliseconds; one stuck in the kernel is left
)


def _subreaper(on: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(err)}")


def _children() -> set[int]:
    """The pids whose parent is this process."""
    me, found = os.getpid(), set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as handle:
                    ppid = int(handle.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == me:
                found.add(int(name))
    return found


@contextlib.contextmanager
def adopted() -> Iterator[None]:
    """Within the block, adopt what descendants orphan; at its end, wait for those orphans (the
    sandbox killed them) so their CPU time counts, and stop adopting."""
    before = _children()
    _subreaper(True)
    try:
        yield
    finally:
        deadline = time.monotonic() + REAP_WAIT_S
        while (left := _children() - before) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            time.sleep(0.01)
        _subreaper(False)
