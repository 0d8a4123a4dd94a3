"""Run untrusted candidate code in a child process that cannot outlive its timeout.

What it does:
- runs the command in the given working directory (callers pass a fresh temp dir);
- starts it in its own session and process group, so the whole tree can be killed;
- applies rlimits: address space, CPU seconds, file size, number of processes;
- scrubs the environment of secrets (``*_API_KEY``, ``*_TOKEN``, ``*_SECRET``, ...);
- captures stdout/stderr up to a byte cap (the rest is discarded, and said so);
- on timeout sends SIGTERM to the group, then SIGKILL after a grace period, and also
  kills any descendant that escaped the group with ``setsid`` (found through /proc).

What it does NOT protect against (run untrusted code on a machine you can lose):
- reading any file the user running evolve can read (no filesystem isolation here);
- network access (no namespace here; see ``isolation`` docs in the README);
- descendants are found by session id and by a marker variable in their environment
  (``EVOLVE_SANDBOX_ID``); one that leaves its session *and* re-executes with a clean
  environment escapes the final kill;
- the address-space limit counts virtual memory, so it is coarse for GPU programs
  (CUDA maps large virtual ranges); set ``memory_bytes=None`` for those.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import selectors
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

SECRET_PATTERN = re.compile(r"(_API_KEY|_TOKEN|_SECRET|_PASSWORD|_CREDENTIALS?)$|^(AWS_|GOOGLE_APPLICATION)", re.I)
KEEP_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV", "CUDA_VISIBLE_DEVICES",
            "LD_LIBRARY_PATH", "TRITON_INTERPRET", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
            "NVSHMEM_DISABLE_NVLS", "OMP_NUM_THREADS", "TERM")
MARKER_VAR = "EVOLVE_SANDBOX_ID"
GRACE_S = 1.0
DRAIN_S = 0.5


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Resource limits for one sandboxed command; None leaves a limit unset."""

    timeout_s: float = 60.0
    memory_bytes: int | None = 8 << 30
    cpu_s: int | None = None
    file_bytes: int | None = 4 << 30
    processes: int | None = 4096
    output_bytes: int = 1 << 20


@dataclass(frozen=True, kw_only=True)
class Result:
    """What a sandboxed command did."""

    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool
    truncated: bool
    leftover: int = 0  # descendants still alive after the command ended (killed, but a red flag)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def tail(self, chars: int = 4000) -> str:
        """The last ``chars`` characters of stderr then stdout, for artifacts."""
        text = (self.stderr.strip() + "\n" + self.stdout.strip()).strip()
        return text[-chars:]


def scrub_env(env: Mapping[str, str], extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Keep only harmless variables, drop anything that looks like a secret, add ``extra``."""
    clean = {k: v for k, v in env.items() if k in KEEP_ENV and not SECRET_PATTERN.search(k)}
    clean.update(extra or {})
    return clean


def _apply_limits(limits: Limits) -> None:
    """Runs in the child between fork and exec."""
    os.setsid()
    pairs = (
        (resource.RLIMIT_AS, limits.memory_bytes),
        (resource.RLIMIT_CPU, limits.cpu_s),
        (resource.RLIMIT_FSIZE, limits.file_bytes),
        (resource.RLIMIT_NPROC, limits.processes),
        (resource.RLIMIT_CORE, 0),
    )
    for kind, value in pairs:
        if value is not None:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(kind, (value, value))


def _members(sid: int, marker: bytes) -> list[int]:
    """Pids in session ``sid`` or carrying ``marker`` in their environment (Linux /proc)."""
    members = []
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            # fields after the command name: state ppid pgrp session ...
            if int(fields[3]) == sid or marker in (entry / "environ").read_bytes():
                members.append(int(entry.name))
    return [pid for pid in members if pid != os.getpid()]


def _kill_tree(pid: int, marker: bytes, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    for member in _members(pid, marker):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(member, sig)


def _read_capped(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[bytes, bytes, bool, bool]:
    """Drain stdout/stderr until both close or the deadline passes."""
    buffers = {"out": bytearray(), "err": bytearray()}
    truncated = False
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ, "out")
    selector.register(proc.stderr, selectors.EVENT_READ, "err")
    timed_out = False
    drain_until = None
    while selector.get_map():
        now = time.monotonic()
        if drain_until is None and proc.poll() is not None:
            drain_until = now + DRAIN_S  # the child exited; whatever still holds a pipe is left over
        if drain_until is not None and now >= drain_until:
            break
        remaining = deadline - now
        if remaining <= 0:
            timed_out = True
            break
        for key, _ in selector.select(timeout=min(remaining, 0.5)):
            chunk = os.read(key.fileobj.fileno(), 65536)
            if not chunk:
                selector.unregister(key.fileobj)
                continue
            buf = buffers[key.data]
            room = cap - len(buf)
            if room > 0:
                buf += chunk[:room]
            truncated |= len(chunk) > room
    selector.close()
    return bytes(buffers["out"]), bytes(buffers["err"]), timed_out, truncated


def run(
    argv: Sequence[str],
    *,
    cwd: Path,
    limits: Limits | None = None,
    env: Mapping[str, str] | None = None,
    stdin: bytes | None = None,
) -> Result:
    """Run ``argv`` in ``cwd`` under ``limits`` and return what it did.

    ``env`` is merged into a scrubbed copy of this process's environment. Output beyond
    ``limits.output_bytes`` per stream is dropped and ``truncated`` is set. The child and
    every descendant are gone when this returns.
    """
    limits = limits or Limits()
    tag = uuid.uuid4().hex
    marker = f"{MARKER_VAR}={tag}".encode()
    start = time.monotonic()
    proc = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=scrub_env(os.environ, {**(env or {}), MARKER_VAR: tag}),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: _apply_limits(limits),  # noqa: PLW1509 - limits must apply before exec
        close_fds=True,
    )
    if stdin is not None:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(stdin)
        proc.stdin.close()
    out, err, timed_out, truncated = _read_capped(proc, start + limits.timeout_s, limits.output_bytes)
    if not timed_out:
        try:
            proc.wait(timeout=max(0.0, start + limits.timeout_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    if timed_out:
        _kill_tree(proc.pid, marker, signal.SIGTERM)
        try:
            proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    # Whatever happened, nothing of the child's session survives this call.
    leftover = 0 if timed_out else len([p for p in _members(proc.pid, marker) if p != proc.pid])
    _kill_tree(proc.pid, marker, signal.SIGKILL)
    proc.wait()
    for stream in (proc.stdout, proc.stderr):
        stream.close()
    suffix = "\n[evolve: output truncated]" if truncated else ""
    return Result(
        returncode=None if timed_out else proc.returncode,
        stdout=out.decode(errors="replace") + suffix,
        stderr=err.decode(errors="replace"),
        wall_s=time.monotonic() - start,
        timed_out=timed_out,
        truncated=truncated,
        leftover=leftover,
    )
