"""Drive candidate programs through a benchmark's real fitness, as the search's workers do."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import threading
from collections.abc import Mapping
from pathlib import Path

from evolve.backends.base import run_job
from evolve.harness.fitness import Fitness
from evolve.types import EvalStatus, Evaluation, Job


def evaluate(
    fitness: Fitness, files: Mapping[str, str], *, seed: int = 0, timeout_s: float = 20.0
) -> Evaluation:
    """Evaluate ``files`` in a fresh workdir through ``run_job`` (write files, ``evaluate_safely``, clean up)."""
    return run_job(
        fitness,
        Job(candidate_id="redteam", files=dict(files), seed=seed, timeout_s=timeout_s),
        None,
    )


def processes_under(folder: Path) -> dict[int, str]:
    """The processes whose working directory lies under ``folder`` (removed or not): pid -> command line."""
    root, found = folder.resolve(), {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            here = Path(os.readlink(proc / "cwd").removesuffix(" (deleted)"))
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if here.is_relative_to(root):
            found[int(proc.name)] = command
    return found


def reach_waiting(module: str) -> str:
    """Candidate code that finds the harness process running ``module`` (started ahead, waiting
    for its job while the candidate trains) and tries its stdin (a forged job: targets of the
    candidate's choosing) and its memory through ``/proc``; it exits naming what it reached, or
    that it found no such process while ``/proc`` lists processes outside its own (so a test of
    it cannot pass for want of a target); where the sandbox's ``/proc`` lists only the
    candidate's own processes (pid 1 unlisted), none is within reach and it exits quietly."""
    return f"""
import glob as _glob, os as _os
_waiting = []
for _cmdline in _glob.glob("/proc/[0-9]*/cmdline"):
    try:
        if {module.encode()!r} in open(_cmdline, "rb").read():
            _waiting.append(_cmdline.split("/")[2])
    except OSError:
        pass
if not _waiting and _os.path.exists("/proc/1"):
    raise SystemExit("found no waiting {module} process")
for _pid in _waiting:
    for _path, _mode in ((f"/proc/{{_pid}}/fd/0", _os.O_WRONLY), (f"/proc/{{_pid}}/mem", _os.O_RDONLY)):
        try:
            _os.close(_os.open(_path, _mode | _os.O_NONBLOCK))
        except OSError:
            continue
        raise SystemExit(f"reached the waiting {module} through {{_path}}")
"""


def reason(evaluation: Evaluation) -> str:
    """Everything the evaluation says about why: error, output, logs."""
    return "\n".join(str(v) for v in evaluation.artifacts.values())


def assert_caught(
    evaluation: Evaluation, status: EvalStatus | tuple[EvalStatus, ...], pattern: str
) -> None:
    """The cheat ended with ``status`` and its artifacts match ``pattern`` (a regex, case-insensitive)."""
    statuses = status if isinstance(status, tuple) else (status,)
    text = reason(evaluation)
    assert evaluation.status in statuses, (
        f"expected {statuses}, got {evaluation.status}: {text[-2000:]}"
    )
    assert re.search(pattern, text, re.I | re.S), (
        f"reason does not match {pattern!r}: {text[-2000:]}"
    )


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Listener:
    """A TCP server on the host's loopback that counts connections (a candidate must never reach it)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()
