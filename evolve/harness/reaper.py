"""Ending the processes a harness process started: its child's group, then every marked descendant.

The scan and the kill loop are the sandbox's (``evolve.sandbox.process``): a process belongs to a
tree when its environment carries the tree's marker (descendants inherit it). A harness
process running inside the sandbox marks the candidate's tree with a marker of its own, so
it can tell the candidate's leftovers from itself before it gives its verdict.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

from evolve.sandbox import process as sandbox

NO_SESSION = (
    -1
)  # the sandbox's scan also matches a session id; harness trees are found by marker only


def new_marker(name: str) -> tuple[str, str]:
    """A fresh ``(variable, value)`` to put in a child's environment; its tree is found by it."""
    return name, uuid.uuid4().hex


def kill_group(proc: subprocess.Popen | int, sig: signal.Signals = signal.SIGKILL) -> None:
    """Send ``sig`` (SIGKILL) to the process group of ``proc`` (started with ``start_new_session``).

    Given a ``Popen``, also reaps it.
    """
    pid = proc if isinstance(proc, int) else proc.pid
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    if not isinstance(proc, int):
        with contextlib.suppress(Exception):
            proc.wait(timeout=10)


def tree_members(marker: bytes) -> list[int]:
    """Live pids other than this one whose environment holds ``marker`` (``NAME=value``)."""
    return sandbox._members(NO_SESSION, marker, None)


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    return ""


def reap_tree(marker: bytes, grace_s: float, ignore: tuple[str, ...] = ()) -> list[str]:
    """Wait up to ``grace_s`` for the processes marked ``marker`` to end, then SIGKILL the rest.

    Returns the command lines of the processes that had to be killed, except those whose
    command line contains one of ``ignore`` (killed all the same). Returns once they are gone.
    """
    deadline = time.monotonic() + grace_s
    while (members := tree_members(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    killed = [c for c in map(_cmdline, members) if not any(word in c for word in ignore)]
    for _ in range(200):  # a fork loop may need several rounds
        if not members:
            break
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
        members = tree_members(marker)
    return killed
