"""Harness-only processes (referee, C++ build) started through the harness layer's protocol."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from evolve.fitness import Limits, Policy, Result, run_sandboxed
from evolve.harness.protocol import SAFE_PATH, job_input, read_verdict


def harness_json(module: str, job: Mapping[str, Any], *, cwd: Path, timeout_s: float, env: Mapping[str, str],
                 gpu: bool, writable: tuple[Path, ...] = ()) -> tuple[dict[str, Any] | None, Result]:  # fmt: skip
    """Run a harness-only process (referee, build) through the harness layer's protocol: the job
    with a fresh nonce on stdin, the verdict as the JSON line carrying that nonce (None when
    there is none: timeout, crash, processes left behind)."""
    limits = Limits(
        timeout_s=timeout_s,
        memory_bytes=None if gpu else 24 << 30,
        processes=None,
        output_bytes=4 << 20,
    )
    nonce, stdin = job_input(dict(job))
    result = run_sandboxed([sys.executable, *SAFE_PATH, "-m", module], cwd=cwd, limits=limits, env=dict(env),
                           stdin=stdin, policy=Policy(writable=writable))  # fmt: skip
    verdict = read_verdict(result, nonce, module.rsplit(".", 1)[-1])
    return (verdict if isinstance(verdict, dict) else None), result
