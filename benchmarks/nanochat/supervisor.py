"""The harness's process in the training sandbox: runs the candidate and times it with its own clock.

Reads its job (JSON) from stdin, starts the candidate's training script under the guard
as a child, and watches the step reports the child sends on a pipe, timestamping each
with this process's clock. The first ``untimed_steps`` steps are not timed; from the end of
the last untimed step, ``budget_s`` seconds later it tells the child to stop; start-up
beyond ``free_startup_s`` (the untimed phase could otherwise hide training) is taken off
that budget. A job with ``max_steps`` (the short run of the layered checks) is told to
stop after that many steps instead, and its verdict carries the loss each step reported.
It kills the child when it overstays: past ``startup_limit_s`` before the timed phase, past
``finish_limit_s`` after the stop, or after more than one step beyond the stop. The
verdict is one JSON line on stdout carrying the job's nonce (the child cannot write there:
this process is undumpable and the child's output goes to a log file).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import time
import uuid

from evolve.benchmarks.nanochat.client import (
    CONFIG_ENV,
    CONFIG_KEYS,
    CONTROL_FD_ENV,
    REPORT_FD_ENV,
)
from evolve.benchmarks.nanochat.procutil import (
    SAFE_PATH,
    kill_group,
    reap_tree,
    serve_job,
    tail,
)

LOG_FILE = "train.log"
TREE_ENV = "NANOCHAT_TREE"  # marks every process the training program starts
LEFTOVER_GRACE_S = 5.0
COMPILE_WORKERS = (
    "compile_worker",
)  # torch.compile's worker pool may take a moment to exit: killed, not held against
MAX_LINE = 1 << 16


class Watch:
    """State of one watched training run (all times from this process's monotonic clock)."""

    def __init__(self, job: dict, start: float) -> None:
        self.job = job
        self.start = start
        self.steps = 0
        self.tokens = 0
        self.timed_tokens = 0
        self.timed_from: float | None = None
        self.last_step_at: float | None = None
        self.stop_sent_at: float | None = None
        self.steps_after_stop = 0
        self.notes: dict[str, float] = {}
        self.max_steps: int | None = job.get("max_steps")
        self.losses: list[float | None] = []  # per step, kept for a job with max_steps only
        self.violations: list[dict] = []
        self.verdict: tuple[str, str] | None = (
            None  # (status, reason) when the harness ended the run
        )

    def on_line(self, line: str, now: float) -> None:
        kind, _, rest = line.partition(" ")
        if kind == "step":
            self.steps += 1
            parts = rest.split()
            if len(parts) >= 2 and parts[1].isdigit():
                self.tokens += int(parts[1])
                if self.timed_from is not None:
                    self.timed_tokens += int(parts[1])
            if self.max_steps is not None and len(self.losses) < self.max_steps:
                self.losses.append(_number(parts[2]) if len(parts) >= 3 else None)
            self.last_step_at = now
            if self.stop_sent_at is not None:
                self.steps_after_stop += 1
            if self.steps == self.job["untimed_steps"]:
                self.timed_from = now
        elif kind == "violation":
            try:
                self.violations.append(json.loads(rest))
            except ValueError:
                self.violations.append({"event": "?", "path": rest[:200]})
        elif kind == "note":
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                self.notes.update({k: float(v) for k, v in json.loads(rest).items()})

    def charged_s(self) -> float:
        """Start-up time beyond the free allowance, taken off the training budget."""
        if self.timed_from is None:
            return 0.0
        return max(0.0, (self.timed_from - self.start) - self.job["free_startup_s"])

    def deadline(self) -> float:
        """When the harness must act next (stop signal or kill)."""
        job = self.job
        if self.stop_sent_at is not None:
            return self.stop_sent_at + job["finish_limit_s"]
        if self.timed_from is None:
            return self.start + job["startup_limit_s"]
        return self.timed_from + max(0.0, job["budget_s"] - self.charged_s())

    def check(self, now: float) -> str | None:
        """'stop' to send the stop byte, 'kill' with ``verdict`` set, or None."""
        if self.violations:
            self.verdict = ("rejected", f"read forbidden data: {self.violations[0]}")
            return "kill"
        if self.steps_after_stop > 1:
            self.verdict = (
                "rejected",
                "kept training after the harness said stop (budget overrun)",
            )
            return "kill"
        if (
            self.stop_sent_at is None
            and self.max_steps is not None
            and self.steps >= self.max_steps
        ):
            return "stop"
        if now < self.deadline():
            return None
        if self.stop_sent_at is not None:
            self.verdict = (
                "timeout",
                f"still running {self.job['finish_limit_s']}s after the harness said stop "
                "(budget overrun: stop at Clock.step() returning False, then save)",
            )
            return "kill"
        if self.timed_from is None:
            self.verdict = (
                "timeout",
                f"did not finish {self.job['untimed_steps']} untimed steps within "
                f"{self.job['startup_limit_s']}s of starting (startup limit)",
            )
            return "kill"
        return "stop"


def _number(text: str) -> float | None:
    """A reported loss ('nan' and 'inf' included), or None when it is no number."""
    try:
        return float(text)
    except ValueError:
        return None


def feed(watch: Watch, buffer: bytes, stamp: float) -> bytes:
    """Hand every complete report line in ``buffer`` to ``watch``; return the incomplete rest."""
    while b"\n" in buffer:
        line, buffer = buffer.split(b"\n", 1)
        watch.on_line(line[:MAX_LINE].decode(errors="replace"), stamp)
    return buffer[-MAX_LINE:]


def supervise(job: dict) -> dict:
    """Run the candidate per ``job`` and return the verdict (without the nonce)."""
    report_r, report_w = os.pipe()
    control_r, control_w = os.pipe()
    config = {k: job[k] for k in CONFIG_KEYS}
    tag = uuid.uuid4().hex
    env = dict(os.environ)
    env.update(
        {
            TREE_ENV: tag,
            CONFIG_ENV: json.dumps(config),
            REPORT_FD_ENV: str(report_w),
            CONTROL_FD_ENV: str(control_r),
        }
    )
    start = time.monotonic()
    with open(LOG_FILE, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, *SAFE_PATH, "-m", "evolve.benchmarks.nanochat.guard", job["entry"]],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            pass_fds=(report_w, control_r),
            start_new_session=True,
        )
    os.close(report_w)
    os.close(control_r)
    watch = Watch(job, start)
    buffer = b""
    eof = False
    while True:
        now = time.monotonic()
        action = watch.check(now)
        if action == "stop":
            # Take in every line already written: steps reported before the stop byte must
            # not count as steps after it (a slow read here once rejected an honest run).
            while not eof and select.select([report_r], [], [], 0)[0]:
                chunk = os.read(report_r, 65536)
                eof = not chunk
                buffer = feed(watch, buffer + chunk, now)
            watch.stop_sent_at = time.monotonic()
            with contextlib.suppress(OSError):  # the child may have closed its end
                os.write(control_w, b"s")
            continue
        if action == "kill":
            kill_group(proc)
            break
        if eof:
            if proc.poll() is not None:
                break
            time.sleep(min(0.05, max(0.0, watch.deadline() - now)))
            continue
        ready, _, _ = select.select([report_r], [], [], max(0.0, min(0.5, watch.deadline() - now)))
        if ready:
            chunk = os.read(report_r, 65536)
            stamp = time.monotonic()
            if not chunk:
                eof = True
                continue
            buffer = feed(watch, buffer + chunk, stamp)
        elif proc.poll() is not None and not select.select([report_r], [], [], 0)[0]:
            break
    end = time.monotonic()
    returncode = proc.wait()
    kill_group(proc)  # anything the child left in its process group goes with it
    # Then every other descendant (found by the marker in its environment), after a short grace.
    leftover = reap_tree(f"{TREE_ENV}={tag}".encode(), LEFTOVER_GRACE_S, ignore=COMPILE_WORKERS)
    timed = watch.timed_from is not None
    result = {
        "steps": watch.steps,
        "tokens": watch.tokens,
        "timed_tokens": watch.timed_tokens,
        "startup_s": (watch.timed_from if timed else end) - start,
        "training_s": (watch.last_step_at - watch.timed_from)
        if timed and watch.last_step_at
        else 0.0,
        "total_s": end - start,
        "stopped_by_harness": watch.stop_sent_at is not None,
        "startup_charged_s": watch.charged_s(),
        "returncode": returncode,
        "notes": watch.notes,
        "violations": watch.violations[:10],
        "log_tail": tail(LOG_FILE),
        "leftover": leftover,
    }
    if watch.max_steps is not None:
        # Reported by the candidate: a short run that lies about its loss only passes a
        # quick check; the full run that follows is scored by the harness's scorer anyway.
        result["losses"] = watch.losses
    if watch.verdict is not None:
        result["status"], result["reason"] = watch.verdict
    elif leftover:
        result["status"], result["reason"] = (
            "rejected",
            f"the training program left {len(leftover)} process(es) running after it exited (killed): "
            + "; ".join(leftover[:3]),
        )
    elif returncode != 0:
        result["status"], result["reason"] = (
            "error",
            f"training program exited with status {returncode}",
        )
    else:  # stopping before the budget is allowed: it only costs the candidate training time
        result["status"], result["reason"] = "ok", ""
    return result


if __name__ == "__main__":
    serve_job(supervise)
