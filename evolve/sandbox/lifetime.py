"""Nothing a run starts outlives it: a mark every process of a session inherits, and the kernel's
parent-death signal, so a resume ends what a run killed by SIGKILL left running.

Each session of a run (a start or a resume) puts a fresh token in its environment
(``EVOLVE_RUN_MARK``) before it starts any process; evaluation workers, provider commands
and their children inherit it. The token is written to ``RUN_DIR/.processes`` while the run
holds its lock, and removed when the session ends; a session killed by SIGKILL leaves it.
The next session, holding the same lock (so the old one is dead), kills every process that
still carries that token, wherever it was reparented. Children the
run starts directly also ask the kernel for a signal when the run dies
(``PR_SET_PDEATHSIG``), so most are gone before any resume. A process that scrubs its
environment (the sandbox gives candidates a fresh one) is ended by whoever started it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

MARK = "EVOLVE_RUN_MARK"
RECORD = ".processes"
PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL, *, parent: int | None = None) -> None:
    """Ask the kernel to send ``sig`` to this process when the thread that started it ends;
    if ``parent`` (the starter's pid) is already gone, send it now."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)


@contextlib.contextmanager
def marked() -> Iterator[str]:
    """Within the block, processes started from here carry a fresh session token (yielded)."""
    token = uuid.uuid4().hex
    before = os.environ.get(MARK)
    os.environ[MARK] = token
    try:
        yield token
    finally:
        if before is None:
            os.environ.pop(MARK, None)
        else:
            os.environ[MARK] = before


@contextlib.contextmanager
def session(run_dir: Path, token: str) -> Iterator[int]:
    """Within the block, ``token`` is recorded as ``run_dir``'s live session; on entry every
    process a dead session left running is killed (their number is yielded). A session that
    ends, however it ends short of SIGKILL, leaves no record: its processes are its own to end.
    Enter it holding the run's lock."""
    path = Path(run_dir) / RECORD
    try:
        old = path.read_text().strip()
    except FileNotFoundError:
        old = ""
    killed = end_marked(old) if old and old != token else 0
    path.write_text(token + "\n")
    try:
        yield killed
    finally:
        path.unlink(missing_ok=True)


def end_marked(token: str, *, timeout_s: float = 10.0) -> int:
    """SIGKILL every process whose environment carries ``token`` until none is left (or
    ``timeout_s``); returns how many were found."""
    found: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while (pids := carrying(token)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        found |= pids
        time.sleep(0.05)
    return len(found)


def carrying(token: str) -> set[int]:
    """The live processes (zombies excluded) whose environment holds ``MARK=token``, this one
    and its ancestors excluded."""
    needle = f"{MARK}={token}".encode()
    spared = _ancestors()
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in spared:
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone, or not ours to read
            continue
        if state != "Z" and needle in environ.split(b"\0"):
            pids.add(int(entry.name))
    return pids


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
    return pids
