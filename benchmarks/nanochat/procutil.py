"""Small process helpers shared by the harness's processes (supervisor, scorer, probe)."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

PR_SET_DUMPABLE = 4
SAFE_PATH = (
    ("-P",) if sys.version_info >= (3, 11) else ()
)  # cwd (the candidate's folder) not on sys.path


def make_undumpable() -> None:
    """Forbid same-user processes (the candidate) to ptrace this one or open its /proc fds."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def serve_job(run: Callable[[dict], dict]) -> None:
    """A harness process's whole life: read its job, answer ``run(job)``, both as JSON lines.

    The job arrives on stdin with a nonce; the answer goes to stdout carrying it, so the
    fitness can tell it from anything else printed there. The process is made undumpable
    first: the candidate (same user) can neither read the nonce from its memory nor its fds.
    """
    make_undumpable()
    job = json.loads(sys.stdin.buffer.readline())
    nonce = job.pop("nonce")
    sys.stdout.write(json.dumps({"nonce": nonce, **run(job)}) + "\n")
    sys.stdout.flush()


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group of ``proc`` (started with ``start_new_session``) and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(timeout=10)


def tree_members(tag: bytes) -> list[int]:
    """Live (not zombie) pids other than this one whose environment holds ``tag``."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int(entry.name)
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if pid != os.getpid() and state not in "ZX" and tag in (entry / "environ").read_bytes():
                found.append(pid)
    return found


def reap_tree(tag: bytes, grace_s: float, ignore: tuple[str, ...] = ()) -> list[str]:
    """Wait up to ``grace_s`` for the processes marked ``tag`` to end, then SIGKILL the rest.

    Returns the command lines of the processes that had to be killed, except those whose
    command line contains one of ``ignore`` (killed all the same). Returns only once they are gone.
    """
    deadline = time.monotonic() + grace_s
    while (members := tree_members(tag)) and time.monotonic() < deadline:
        time.sleep(0.1)
    killed = []
    for pid in members:
        with contextlib.suppress(OSError):
            cmdline = (
                Path(f"/proc/{pid}/cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode(errors="replace")
            )
            if not any(word in cmdline for word in ignore):
                killed.append(cmdline.strip()[:200])
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while tree_members(tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    return killed


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
