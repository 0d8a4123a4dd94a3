"""A training program run bare: no sandbox, no harness process, its training rows in memory.

What the harness costs a training program's speed is its timed tokens/s under the harness
against the same program run this way (issue 18 asks for at least 99%). ``run_bare`` starts
``python -m evolve.harness.bare`` in the program's folder; that process loads the rows,
installs ``MemoryChannel`` as the stream's channel (``evolve.harness.stream.install``) and
runs the program's entry file as ``__main__``. The stand-in keeps the harness's rules and
its way of timing: synthetic rows of the same shape during the untimed steps, real rows
from memory while the clock runs (counted as they are handed out), the stop once the
budget is spent, the window from the end of the last untimed step to the last step, and a
device synchronisation at every step's end, as the stream does. No profile is taken.
"""

from __future__ import annotations

import dataclasses
import json
import os
import runpy
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from evolve.harness import stream
from evolve.harness.protocol import SAFE_PATH
from evolve.sandbox.isolation import Policy
from evolve.sandbox.process import Limits
from evolve.sandbox.process import run as run_sandboxed

RESULT_TAG = "EVOLVE_BARE_RESULT "
ROWS_FILE = "evolve-bare-rows.npy"
SETTINGS_ENV = "EVOLVE_BARE_SETTINGS"


class MemoryChannel:
    """The stream's stand-in: rows from an array, the clock kept in this process."""

    def __init__(self, rows: np.ndarray, *, budget_s: float, untimed_steps: int, vocab: int, bos: int) -> None:  # fmt: skip
        self.rows, self.next_row = rows, 0
        self.budget_s, self.untimed_steps = budget_s, untimed_steps
        self.vocab, self.bos = vocab, bos
        self.noise = np.random.default_rng(0)
        self.steps = self.tokens = 0
        self.timed_from: float | None = None
        self.last_step_at: float | None = None
        self.stopped = False

    def batch(self, rows: int) -> np.ndarray:
        """Synthetic rows before the clock, the next rows in memory while it runs (from the
        start again when they run out), EndOfData after the stop."""
        if self.stopped:
            raise stream.EndOfData("the budget is spent: no more training data")
        if self.timed_from is None:
            batch = self.noise.integers(0, self.vocab, size=(rows, self.rows.shape[1]), dtype=np.int32)
            batch[:, 0] = self.bos
            return batch
        take = (self.next_row + np.arange(rows)) % len(self.rows)
        self.next_row = int(take[-1]) + 1
        self.tokens += rows * (self.rows.shape[1] - 1)
        return self.rows[take]

    def step(self, tokens: int = 0, loss: float | None = None) -> bool:
        """A step ended (after the device finished it); False once the budget is spent."""
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        now = time.monotonic()
        self.steps += 1
        self.last_step_at = now
        if self.steps == self.untimed_steps:
            self.timed_from = now
        elif self.timed_from is not None and now - self.timed_from >= self.budget_s:
            self.stopped = True
        return not self.stopped

    def note(self, **values: float) -> None:
        """Notes go nowhere: there is no harness to show them."""

    def saved_initial(self) -> None:
        """The initial checkpoint too: nothing is exported here."""

    def saved(self) -> None:
        """The checkpoint is the program's own business here."""

    def result(self) -> dict:
        """Steps, real tokens, and the timed window's seconds and tokens/s."""
        window = (self.last_step_at - self.timed_from) if self.timed_from and self.last_step_at else 0.0
        return {"steps": self.steps, "tokens": self.tokens, "training_s": window,
                "tokens_per_s": self.tokens / window if window > 0 else 0.0}  # fmt: skip


def run_bare(program: Path, rows: np.ndarray, *, entry: str, env: Mapping[str, str], budget_s: float,
             untimed_steps: int, vocab: int, bos: int, timeout_s: float,
             sandbox: tuple[Limits, Policy] | None = None) -> dict:  # fmt: skip
    """Run ``program``'s ``entry`` bare with ``rows`` (int32, seq_len + 1 wide) as its training data;
    its ``MemoryChannel.result()`` plus the process's wall time and output tail. ``env`` is
    added to this process's environment.

    ``sandbox``: the harness's (limits, policy), to run it bare but inside the sandbox: the
    sandbox's own share of the harness's tax (``env`` is then added to the sandbox's scrubbed
    environment instead, as for the harness's processes)."""
    rows_file = Path(program) / ROWS_FILE  # in the program's folder: the sandbox's /tmp is its own
    np.save(rows_file, rows)
    settings = {"rows": str(rows_file), "entry": entry, "budget_s": budget_s,
                "untimed_steps": untimed_steps, "vocab": vocab, "bos": bos}  # fmt: skip
    argv = [sys.executable, *SAFE_PATH, "-m", "evolve.harness.bare"]
    full_env = {**env, SETTINGS_ENV: json.dumps(settings)}
    start = time.monotonic()
    try:
        if sandbox is None:
            done = subprocess.run(argv, cwd=program, env={**os.environ, **full_env}, capture_output=True,
                                  text=True, timeout=timeout_s)  # fmt: skip
            stdout, stderr, returncode = done.stdout, done.stderr, done.returncode
        else:
            limits, policy = sandbox
            result = run_sandboxed(argv, cwd=Path(program), env=full_env, policy=policy,
                                   limits=dataclasses.replace(limits, timeout_s=timeout_s))  # fmt: skip
            stdout, stderr, returncode = result.stdout, result.stderr, result.returncode
    finally:
        rows_file.unlink(missing_ok=True)
    lines = [line for line in stdout.splitlines() if line.startswith(RESULT_TAG)]
    if not lines:
        raise RuntimeError(f"the bare run gave no result (exit {returncode}):\n{stderr[-3000:]}")
    return {**json.loads(lines[-1][len(RESULT_TAG):]), "wall_s": time.monotonic() - start,
            "returncode": returncode, "log_tail": (stdout + stderr)[-2000:]}  # fmt: skip


def main() -> None:
    """The bare process: load the rows, install the stand-in, run the entry, print the result."""
    settings = json.loads(os.environ.pop(SETTINGS_ENV))
    channel = MemoryChannel(np.load(settings["rows"]), budget_s=settings["budget_s"],
                            untimed_steps=settings["untimed_steps"], vocab=settings["vocab"],
                            bos=settings["bos"])  # fmt: skip
    stream.install(channel)
    sys.path.insert(0, os.getcwd())
    try:
        runpy.run_path(settings["entry"], run_name="__main__")
    finally:
        sys.stdout.write(RESULT_TAG + json.dumps(channel.result()) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
