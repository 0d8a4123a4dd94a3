"""Harness-only processes (referee, C++ build) started through the harness layer's protocol,
and the fast exit of the kernels benchmark's own processes (referee, driver)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

from evolve.fitness import Limits, Policy, Result, Started, start_sandboxed
from evolve.harness.protocol import SAFE_PATH, job_input, read_verdict


def start_harness(module: str, *, cwd: Path, timeout_s: float, env: Mapping[str, str], gpu: bool,
                  writable: tuple[Path, ...] = ()) -> Started:  # fmt: skip
    """Start a harness-only process ahead of its job: it imports what it needs, then waits for
    the job that ``harness_json`` sends (``sandbox.start``; ``cancel()`` it when unused)."""
    return start_sandboxed([sys.executable, *SAFE_PATH, "-m", module], cwd=cwd, limits=harness_limits(timeout_s, gpu),
                           env=dict(env), policy=Policy(writable=writable))  # fmt: skip


def harness_limits(timeout_s: float, gpu: bool) -> Limits:
    """The limits of the benchmark's own processes: no memory cap with CUDA (it reserves address
    space at once), no process cap (compile workers), 4 MiB of output."""
    return Limits(
        timeout_s=timeout_s,
        memory_bytes=None if gpu else 24 << 30,
        processes=None,
        output_bytes=4 << 20,
    )


def harness_json(module: str, job: Mapping[str, Any], *, cwd: Path, timeout_s: float, env: Mapping[str, str],
                 gpu: bool, writable: tuple[Path, ...] = (), started: Started | None = None,
                 ) -> tuple[dict[str, Any] | None, Result]:  # fmt: skip
    """Run a harness-only process (referee, build) through the harness layer's protocol: the job
    with a fresh nonce on stdin, the verdict as the JSON line carrying that nonce (None when
    there is none: timeout, crash, processes left behind). ``started``: the process, already
    started by ``start_harness`` with the same arguments (else it starts now)."""
    nonce, stdin = job_input(dict(job))
    if started is None:
        started = start_harness(
            module, cwd=cwd, timeout_s=timeout_s, env=env, gpu=gpu, writable=writable
        )
    result = started.finish(stdin)
    verdict = read_verdict(result, nonce, module.rsplit(".", 1)[-1])
    return (verdict if isinstance(verdict, dict) else None), result


def exit_now(code: int) -> NoReturn:
    """End this process at once, its answer already written: Python's teardown of torch's modules
    takes seconds that every evaluation would pay (2.6 s measured on the 2-core development
    machine). Only without child processes (e.g. a compile worker pool), which a normal exit
    shuts down and the sandbox would otherwise count as left behind."""
    sys.stdout.flush()
    sys.stderr.flush()
    if _has_children():
        sys.exit(code)
    os._exit(code)


def _has_children() -> bool:
    """True when this process has a child, or when Linux cannot say (``/proc/.../children``)."""
    try:
        tasks = list(Path(f"/proc/{os.getpid()}/task").iterdir())
        return any((task / "children").read_text().split() for task in tasks)
    except OSError:
        return True
