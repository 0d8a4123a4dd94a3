"""The job/verdict protocol between the fitness and its harness processes: one nonce'd JSON line each way.

The fitness starts a harness process (supervisor, scorer, probe) in the sandbox with
``python -P -s -m MODULE`` and writes its job to stdin as one JSON line carrying a fresh nonce,
optionally followed by a binary payload. The process makes itself undumpable (the candidate,
same user, can neither ptrace it nor open its ``/proc`` fds), reads the job, runs it and
writes its verdict as one JSON line carrying the nonce to stdout. Candidate code runs only in
children whose stdin is closed and whose output goes to a log file, so nothing it prints can
pass for the verdict: ``read_verdict`` takes only the line carrying the nonce. Before its
verdict, a training harness process may write progress lines (``say_progress``: the step and loss
its clock took in), which the fitness reads as they come (``progress_detail``) to tell the log.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import secrets
import sys
from collections.abc import Callable
from typing import Any

from evolve.sandbox.process import Result
from evolve.types import EvalStatus, Evaluation

PR_SET_DUMPABLE = 4
SAFE_PATH = ("-P", "-s") if sys.version_info >= (3, 11) else ("-s",)
"""Interpreter flags keeping the cwd (the candidate's folder) and the user site off sys.path, so
that the candidate cannot shadow harness modules nor have its code run at start-up: in the
sandbox HOME is the candidate's, so the user site (and its ``usercustomize``) would be its."""

STATUS = {
    "rejected": EvalStatus.REJECTED,
    "timeout": EvalStatus.TIMEOUT,
    "error": EvalStatus.ERROR,
    "invalid": EvalStatus.INVALID,
}


PROGRESS = "progress"
"""A progress line's key: ``{"progress": {"step": N, "loss": X or null}}``."""


def say_progress(step: int, loss: float | None) -> None:
    """Write a progress line on stdout: ``step`` steps reported, the latest ``loss`` (or None)."""
    shown = loss if loss is not None and math.isfinite(loss) else None
    sys.stdout.write(json.dumps({PROGRESS: {"step": int(step), "loss": shown}}) + "\n")
    sys.stdout.flush()


def progress_detail(line: str) -> str | None:
    """What a progress line tells, formatted here from its numbers ("step 120, loss 3.41"), or None
    for any other line: no text of the line itself reaches the log."""
    if not line.startswith("{"):
        return None
    try:
        fields = json.loads(line).get(PROGRESS)
        step, loss = fields["step"], fields.get("loss")
    except (ValueError, AttributeError, TypeError, KeyError, RecursionError):
        return None
    if type(step) is not int or step < 0:
        return None
    if isinstance(loss, int | float) and not isinstance(loss, bool) and math.isfinite(loss):
        return f"step {step}, loss {loss:.2f}"
    return f"step {step}"


def make_undumpable() -> None:
    """Forbid same-user processes (the candidate) to ptrace this one or open its /proc fds."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def job_input(job: dict[str, Any], payload: bytes = b"") -> tuple[str, bytes]:
    """A fresh nonce and the stdin bytes that hand ``job`` (then ``payload``) to a harness process."""
    nonce = secrets.token_hex(16)
    return nonce, (json.dumps({**job, "nonce": nonce}) + "\n").encode() + payload


def serve_job(run: Callable[[dict], dict]) -> None:
    """A harness process's whole life: read its job from stdin, answer ``run(job)`` on stdout with the nonce."""
    make_undumpable()
    job = json.loads(sys.stdin.buffer.readline())
    nonce = job.pop("nonce")
    sys.stdout.write(json.dumps({"nonce": nonce, **run(job)}) + "\n")
    sys.stdout.flush()


def read_verdict(result: Result, nonce: str, what: str) -> dict | Evaluation:
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
            if isinstance(data, dict) and secrets.compare_digest(str(data.get("nonce", "")), nonce):
                return data
    return Evaluation(
        status=EvalStatus.ERROR,
        artifacts={
            "error": f"the harness's {what} process gave no verdict (exit status {result.returncode})",
            "output": result.tail(),
        },
    )


class EvalFailure(Exception):
    """A harness process's verdict that is not "ok": ``status`` (a verdict status) and ``reason``."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def failed(verdict: dict, *, metrics: dict[str, Any] | None = None, **artifacts: str) -> Evaluation:
    """The Evaluation of a verdict whose status is not "ok" (its reason as the error)."""
    return Evaluation(
        status=STATUS.get(verdict["status"], EvalStatus.ERROR),
        metrics=metrics or {},
        artifacts={**artifacts, "error": verdict.get("reason", "")},
    )


def tail(path: os.PathLike | str, chars: int = 3000) -> str:
    """The last ``chars`` characters of a text file, e.g. a candidate's log ('' if missing)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - chars))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""
