"""Adopting the processes a sandboxed command orphans, so that their CPU time is counted.

``RUSAGE_CHILDREN`` holds the CPU time of the children this process waited for, each with
the time of the descendants it waited for. A descendant whose parent exits first (a double
fork) is re-parented to the nearest child subreaper, else to init, which reaps it: its CPU
time never reaches the harness. With this process a subreaper (``adopt``), such orphans
become its children, and ``reap`` collects the finished ones (the sandbox kills the others),
adding their time. Call ``reap`` once the sandboxed command's whole tree is gone (``run``
has returned), in a process with no other child that something else will wait for.
"""

from __future__ import annotations

import contextlib
import ctypes
import os

PR_SET_CHILD_SUBREAPER = 36


def adopt() -> None:
    """Make this process the subreaper of its descendants (kept for its lifetime)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(err)}")


def reap() -> int:
    """Reap every finished child of this process; return how many were reaped."""
    me, reaped = os.getpid(), 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                state, ppid = handle.read().rsplit(b")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if state == b"Z" and int(ppid) == me:
            with contextlib.suppress(ChildProcessError):
                reaped += os.waitpid(int(name), os.WNOHANG)[0] != 0
    return reaped
