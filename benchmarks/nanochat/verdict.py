"""The harness processes' verdicts, read in the fitness's process: one nonce-carrying JSON line each."""

from __future__ import annotations

import json
import secrets
from typing import Any

from evolve.fitness import Result
from evolve.types import EvalStatus, Evaluation

STATUS = {
    "rejected": EvalStatus.REJECTED,
    "timeout": EvalStatus.TIMEOUT,
    "error": EvalStatus.ERROR,
    "invalid": EvalStatus.INVALID,
}


def read(result: Result, nonce: str, what: str) -> dict | Evaluation:
    """The harness process's JSON verdict from a sandbox result, or the failed Evaluation."""
    if result.timed_out:
        return Evaluation(
            status=EvalStatus.TIMEOUT,
            artifacts={"error": f"{what} exceeded its wall limit", "output": result.tail()},
        )
    if result.leftover:  # work left behind could outlive the measurement: never score it
        return Evaluation(
            status=EvalStatus.REJECTED,
            artifacts={
                "error": f"{what} left {result.leftover} process(es) running after it exited (killed)",
                "output": result.tail(),
            },
        )
    for line in reversed(result.stdout.splitlines()):
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if secrets.compare_digest(str(data.get("nonce", "")), nonce):
                return data
    return Evaluation(
        status=EvalStatus.ERROR,
        artifacts={
            "error": f"the harness's {what} process gave no verdict (exit status {result.returncode})",
            "output": result.tail(),
        },
    )


def failed(verdict: dict, *, metrics: dict[str, Any] | None = None, **artifacts: str) -> Evaluation:
    """The Evaluation of a verdict whose status is not "ok" (its reason as the error)."""
    return Evaluation(
        status=STATUS.get(verdict["status"], EvalStatus.ERROR),
        metrics=metrics or {},
        artifacts={**artifacts, "error": verdict.get("reason", "")},
    )
