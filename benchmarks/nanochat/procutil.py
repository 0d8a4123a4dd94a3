"""Small process helpers shared by the harness's supervisor and scorer."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys

PR_SET_DUMPABLE = 4
SAFE_PATH = (
    ("-P",) if sys.version_info >= (3, 11) else ()
)  # cwd (the candidate's folder) not on sys.path


def make_undumpable() -> None:
    """Forbid same-user processes (the candidate) to ptrace this one or open its /proc fds."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group of ``proc`` (started with ``start_new_session``) and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(timeout=10)


def tail(path: os.PathLike | str, chars: int = 3000) -> str:
    """The last ``chars`` characters of a text file ('' if missing)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - chars))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""
