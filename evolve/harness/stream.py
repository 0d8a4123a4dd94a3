"""The training program's end of the harness clock: step reports, the stop signal, the timed data stream.

Imported by a benchmark's client module inside the candidate's process. Batches come from
the harness on a pipe, synthetic (same shape) until the harness's clock runs, real while
it runs, and none after the stop (``EndOfData``). See ``evolve.harness.clock``.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time

import numpy as np

from evolve.harness.clock import (
    BATCH_HEADER,
    CONTROL_FD_ENV,
    DATA_FD_ENV,
    GO_FD_ENV,
    MAX_BATCH_ROWS,
    REPORT_FD_ENV,
    UNTIMED_ENV,
)
from evolve.harness.profiling import StepProfiler, requested


class EndOfData(StopIteration):
    """The harness ended the data stream: the budget is spent."""


def _fd(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        raise RuntimeError(f"{name} is not set: run this program through its benchmark's harness")
    return int(value)


def _read_exact(fd: int, size: int) -> bytes:
    parts, remaining = [], size
    while remaining:
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            raise EndOfData("the harness closed the data stream")
        parts.append(chunk)
        remaining -= len(chunk)
    return b"".join(parts)


def tokens(data: bytes, count: int, width: int, itemsize: int) -> np.ndarray:
    """A batch's (count, width) int32 tokens from the ``itemsize`` bytes each that the pipe carried."""
    wire = np.frombuffer(data, dtype=np.uint16 if itemsize == 2 else np.int32)
    return wire.reshape(count, width).astype(np.int32, copy=False)


class Channel:
    """This process's pipes to the harness (one per process; made on first use)."""

    def __init__(self) -> None:
        self.report = _fd(REPORT_FD_ENV)
        self.control = _fd(CONTROL_FD_ENV)
        self.data = _fd(DATA_FD_ENV)
        self.stopped = False
        self.steps = 0
        # from this step on, a step asks for the next step's batches (``batch``, ``UNTIMED_ENV``)
        self.ask_ahead_from = int(os.environ.get(UNTIMED_ENV, "-1"))
        self.step_rows: list[int] = []  # the rows of each batch the program took in this step
        self.last_step_rows: list[int] = []  # and in the step before
        self.asked: list[int] = []  # rows of the requests sent and not yet answered
        self.held: np.ndarray | None = None  # rows answered and not yet handed out
        asked = requested()  # the harness's profile of a few timed steps (feedback only)
        self.profiler = StepProfiler(*asked) if asked else None
        self.profile_owed = bool(asked)  # one profile line after the first checkpoint

    def send(self, line: str) -> None:
        os.write(self.report, (line + "\n").encode())

    def step(self, tokens: int = 0, loss: float | None = None) -> bool:
        """Report a step's end (after the GPU finished it); False once the harness said stop."""
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # the step ends when the GPU is done, not when it was queued
        report = f"step 0 {int(tokens)}"
        self.send(report if loss is None else f"{report} {float(loss)!r}")
        if not self.stopped and select.select([self.control], [], [], 0)[0]:
            self.stopped = bool(os.read(self.control, 1))
        self.steps += 1
        self.last_step_rows, self.step_rows = self.step_rows, []
        if self.profiler is not None:
            self._profile(
                lambda p: p.abandon() if self.stopped else p.after_step(self.steps, int(tokens))
            )
        return not self.stopped

    def batch(self, rows: int) -> np.ndarray:
        """The next (rows, width) int32 batch from the harness; EndOfData after the stop.

        From the first timed step on (``UNTIMED_ENV``), once a step has taken as many batches
        as the last one, it asks for the next step's (the sizes of this one's), so that the
        harness makes and sends them while this step trains. Rows come in the harness's order
        whatever sizes are asked."""
        started = time.perf_counter()
        rows, parts, have = min(max(int(rows), 1), MAX_BATCH_ROWS), [], 0  # as the harness caps it
        self.step_rows.append(rows)
        while have < rows:
            if self.held is None:
                if not self.asked:
                    self._ask(rows - have)
                self.held = self._answer()
            take = min(rows - have, len(self.held))
            parts.append(self.held[:take])
            self.held = self.held[take:] if take < len(self.held) else None
            have += take
        if (
            len(self.step_rows) == len(self.last_step_rows)
            and not self.stopped
            and 0 <= self.ask_ahead_from <= self.steps
        ):
            for ahead in self.step_rows:
                self._ask(ahead)
        if self.profiler is not None:
            self.profiler.waited(time.perf_counter() - started)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _ask(self, rows: int) -> None:
        self.send(f"batch {rows}")
        self.asked.append(rows)

    def _answer(self) -> np.ndarray:
        """The harness's answer to the oldest request; EndOfData once it says the stop came."""
        count, width, itemsize = BATCH_HEADER.unpack(_read_exact(self.data, BATCH_HEADER.size))
        self.asked.pop(0)
        if count == 0:
            self.asked.clear()  # every later request is answered the same: none is read again
            raise EndOfData("the harness's budget is spent: no more training data")
        return tokens(_read_exact(self.data, count * width * itemsize), count, width, itemsize)

    def note(self, **values: float) -> None:
        self.send("note " + json.dumps({k: float(v) for k, v in values.items()}))

    def saved_initial(self) -> None:
        """Tell the harness the initial checkpoint is written (``clock.run_timed``'s ``on_initial``)."""
        self.send("initial")

    def saved(self) -> None:
        """Tell the harness the checkpoint is written (it fixes its digest now); then, when a
        profile of the timed steps was asked for, send it (summarised only now; null when none
        was taken): after the stop, the harness ends the program once both are in."""
        self.send("saved")
        if self.profile_owed:
            summary = self._profile(lambda p: p.report()) if self.profiler is not None else None
            self.profiler, self.profile_owed = None, False
            self.send("profile " + json.dumps(summary))

    def _profile(self, call):
        """``call(profiler)``; a profile that fails (e.g. the program runs a profiler of its own)
        is dropped, never the program: it is feedback only."""
        try:
            return call(self.profiler)
        except Exception:
            self.profiler = None
            return None


_channel: Channel | None = None


def channel() -> Channel:
    """This process's channel to the harness."""
    global _channel
    if _channel is None:
        _channel = Channel()
    return _channel


def wait_for_go() -> dict:
    """In a process the harness launched ahead of its job (``clock.launch(waits=True)``): block
    until the harness's go message arrives and return it ({} when the harness went away)."""
    fd, text = _fd(GO_FD_ENV), b""
    while not text.endswith(b"\n"):
        chunk = os.read(fd, 65536)
        if not chunk:
            return {}
        text += chunk
    os.close(fd)
    return json.loads(text)


def install(stand_in) -> None:
    """Use ``stand_in`` as this process's channel (``evolve.harness.bare``: a program run without
    the harness); it answers ``batch``, ``step``, ``note``, ``saved_initial`` and ``saved`` as a
    Channel does."""
    global _channel
    _channel = stand_in
