"""The harness-side clock and timed data stream of a training program (run by a harness process).

The training program runs as a child and talks to the harness over three inherited pipes
(``evolve.harness.stream`` is its end): it reports step ends (``step N TOKENS [LOSS]``),
asks for batches (``batch ROWS``), reports its checkpoint (``saved``) and, optionally, its
initial checkpoint before the clock starts (``initial``: the harness may begin work that needs
only the model's code, e.g. its export, while it trains); the harness answers
batches on a data pipe and sends one stop byte on a control pipe. Every report is stamped
with this process's clock, never the program's. A program launched before its job
(``launch(waits=True)``: harness code that imports, then waits) gets a fourth pipe, on which
``Program.go`` sends what it needs to start the candidate's code. Told the untimed steps
(``UNTIMED_ENV``), the stream asks for the next step's batches as soon as a timed step has
taken as many as the last one, so that they are made and wait in the pipe while the step
trains instead of the program waiting for them. Whatever it asks, the harness makes up to a
step's worth of real rows ahead in quiet moments (``PREPARE_WHEN_QUIET_S``), and sends token ids
as uint16 where they fit. Rows keep their order, and batches sent but never read (asked for
ahead when the stop came) are not counted.

The timed window: the first ``untimed_steps`` steps (warm-up, compilation) get synthetic
batches of the same shape as real ones; real training data flows only from the end of the
last untimed step until the stop, and after the stop the stream ends. Start-up (process
start, or a waiting program's go, to the end of the untimed steps: imports, data,
compilation, work done at import time) beyond ``free_startup_s`` seconds is taken off the
budget. After the stop the program must report its checkpoint within what the rest of the
step in flight and the checkpoint's write need on this machine, as the harness measures them
(``evolve.harness.savetime``: a fixed floor per scale, the program's typical step, the
write of as many bytes), or be rejected: the harness then fixes the checkpoint's digest, and
what is scored is the state at the stop. It must exit within ``finish_limit_s``. Once it
has reported the checkpoint after the stop (and the profile, when one was asked for), the
harness has all it needs and ends the program itself:
its exit (Python's and CUDA's teardown, 2.3-2.7 s of every GPU evaluation on the H200) is
nobody's time. More than one step reported after the stop, a start-up past
``startup_limit_s`` or a forbidden-data report (``violation``) kills and rejects it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import struct
import subprocess
import termios
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from evolve.harness.profiling import sanitize
from evolve.harness.protocol import tail
from evolve.harness.reaper import kill_group, reap_tree
from evolve.harness.savetime import SaveAllowance

REPORT_FD_ENV = "EVOLVE_REPORT_FD"
CONTROL_FD_ENV = "EVOLVE_CONTROL_FD"
DATA_FD_ENV = "EVOLVE_DATA_FD"
GO_FD_ENV = "EVOLVE_GO_FD"  # a waiting program's go message arrives here (``launch(waits=True)``)
UNTIMED_ENV = "EVOLVE_UNTIMED_STEPS"  # the window's untimed steps: the stream asks ahead after them
# rows, width and bytes a token (2 or 4) of the batch that follows; 0 rows: the end of the data
BATCH_HEADER = struct.Struct("<III")
MAX_LINE = 1 << 16
MAX_BATCH_ROWS = 1 << 16
MADE_AHEAD_BYTES = 1 << 25  # answers made, not yet written, at most (more as the pipe drains)
PIPE_BYTES = 1 << 20
# Rows are made ahead only after this long without a report, a request or room in the pipe:
# making a batch keeps this process busy ~1-2 ms, and when it does so as the program starts a
# step, the program can wait for the CPU (on Linux a process woken by our write may queue on
# ours; scripts/batch_latency.py shows the waits by a batch's place in its step).
PREPARE_WHEN_QUIET_S = 0.01
ANSWERS_KEPT = 4096  # the latest answers' sizes, to tell how many rows the unread bytes hold
F_SETPIPE_SZ = 1031
LEFTOVER_GRACE_S = 5.0

Feed = Callable[[int, bool], np.ndarray]
"""``feed(rows, real)``: a (rows, width) int32 batch; real training rows, or synthetic ones of the same shape."""


@dataclass(frozen=True, kw_only=True)
class Window:
    """The timed window's settings (seconds on the harness's clock).

    Attributes:
        budget_s: training time after the untimed steps.
        untimed_steps: warm-up steps before the clock starts (synthetic data).
        startup_limit_s: the untimed steps must end within this of the process start.
        free_startup_s: start-up allowed for free (a compile allowance); the excess is charged.
        finish_limit_s: the program must exit within this after the stop (and report its
            checkpoint within it, else it is killed).
        save_floor_s: the fixed floor of the time the checkpoint may be reported after the
            stop (``savetime.SaveAllowance``).
        max_steps: stop after this many steps instead (a short run), or None.
        profiled: the program was asked for a profile, which it reports after its checkpoint.
    """

    budget_s: float
    untimed_steps: int
    startup_limit_s: float
    free_startup_s: float
    finish_limit_s: float
    save_floor_s: float
    max_steps: int | None = None
    profiled: bool = False


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


class Watch:
    """State of one watched training run (all times from this process's monotonic clock)."""

    def __init__(self, window: Window, start: float) -> None:
        self.window = window
        self.start = start
        self.steps = self.reported_tokens = 0
        self.real_tokens = self.synthetic_batches = 0
        self.timed_from: float | None = None
        self.last_step_at: float | None = None
        self.stop_sent_at: float | None = None
        self.saved_at: float | None = None
        self.saves = 0
        self.initial_before_clock: bool | None = None  # the first ``initial`` report, if any
        self.step_stamps: list[float] = []  # the timed steps' reports before the stop
        self.save_allowance: SaveAllowance | None = None  # judged at the report after the stop
        self.steps_after_stop = 0
        self.notes: dict[str, float] = {}
        self.losses: list[float | None] = []  # per step, kept for a short run only
        self.loss: float | None = None  # the latest step's reported loss (shown, never used)
        self.violations: list[dict] = []
        self.requests: list[int] = []  # batch sizes asked for and not yet answered
        # rows asked for since the last step report, and between the two reports before it
        self.rows_this_step = self.rows_per_step = 0
        self.first_batch_at: float | None = None
        self.profile: dict | None = None  # the program's profile of a few steps (feedback only)
        self.profile_reported = False  # its line arrived (null when it took none)
        self.verdict: tuple[str, str] | None = None  # (status, reason) when the harness ended it

    @property
    def saved_since_stop(self) -> bool:
        """The checkpoint was reported after the stop (or, with no stop yet, at all)."""
        return self.saved_at is not None and (
            self.stop_sent_at is None or self.saved_at >= self.stop_sent_at
        )

    @property
    def done(self) -> bool:
        """All the harness needs has arrived: the checkpoint since the stop, and the profile when
        one was asked for; the program may be ended."""
        return (
            self.stop_sent_at is not None
            and self.saved_since_stop
            and (self.profile_reported or not self.window.profiled)
        )

    @property
    def streaming(self) -> bool:
        """Real data flows: the clock runs and the stop has not been sent."""
        return self.timed_from is not None and self.stop_sent_at is None

    def on_line(self, line: str, now: float) -> None:
        kind, _, rest = line.partition(" ")
        if kind == "step":
            self.steps += 1
            self.rows_per_step, self.rows_this_step = self.rows_this_step, 0
            parts = rest.split()
            if len(parts) >= 2 and parts[1].isdigit():
                self.reported_tokens += int(parts[1])
            self.loss = _number(parts[2]) if len(parts) >= 3 else None
            if self.window.max_steps is not None and len(self.losses) < self.window.max_steps:
                self.losses.append(self.loss)
            self.last_step_at = now
            if self.stop_sent_at is not None:
                self.steps_after_stop += 1
            elif self.steps >= self.window.untimed_steps:
                self.step_stamps.append(now)
            if self.steps == self.window.untimed_steps:
                self.timed_from = now
        elif kind == "batch" and rest.strip().isdigit():
            if self.first_batch_at is None:
                self.first_batch_at = now
            self.requests.append(max(1, min(int(rest), MAX_BATCH_ROWS)))
            self.rows_this_step += self.requests[-1]
        elif kind == "saved":  # the last one counts (a program may also save along the way)
            self.saved_at = now
            self.saves += 1
        elif kind == "initial" and self.initial_before_clock is None:  # the first one counts
            self.initial_before_clock = self.timed_from is None
        elif kind == "violation":
            try:
                self.violations.append(json.loads(rest))
            except ValueError:
                self.violations.append({"event": "?", "path": rest[:200]})
        elif kind == "profile":
            self.profile, self.profile_reported = sanitize(rest), True
        elif kind == "note":
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                self.notes.update({k: float(v) for k, v in json.loads(rest).items()})

    def judge_save(self, n_bytes: int, write_dir: str) -> None:
        """Judge the checkpoint just reported (``n_bytes`` of files): once the stop was sent,
        it must come within the ``SaveAllowance``, else ``verdict`` rejects it; the write of
        ``n_bytes`` is measured in ``write_dir`` only when the rest does not cover it."""
        if self.stop_sent_at is None or not self.saved_since_stop:
            return
        gap = self.saved_at - self.stop_sent_at
        allowance = SaveAllowance.of(floor_s=self.window.save_floor_s, step_stamps=self.step_stamps)
        if gap > allowance.total_s:
            allowance = allowance.with_write(n_bytes, write_dir)
        self.save_allowance = allowance
        if gap > allowance.total_s:
            self.verdict = (
                "rejected",
                f"reported a checkpoint {gap:.2f}s after the stop; the step in flight and the "
                f"write need at most {allowance.describe()}: the scored state is the one at the "
                "stop, so save at once when Clock.step() returns False and train nothing after it",
            )

    def charged_s(self) -> float:
        """Start-up time beyond the free allowance, taken off the training budget."""
        if self.timed_from is None:
            return 0.0
        return max(0.0, (self.timed_from - self.start) - self.window.free_startup_s)

    def deadline(self) -> float:
        """When the harness must act next (stop signal or kill)."""
        w = self.window
        if self.stop_sent_at is not None:
            return self.stop_sent_at + w.finish_limit_s
        if self.timed_from is None:
            return self.start + w.startup_limit_s
        return self.timed_from + max(0.0, w.budget_s - self.charged_s())

    def check(self, now: float) -> str | None:
        """'stop' to send the stop byte, 'kill' with ``verdict`` set, or None."""
        w = self.window
        if self.violations:
            self.verdict = ("rejected", f"read forbidden data: {self.violations[0]}")
            return "kill"
        if self.steps_after_stop > 1:
            self.verdict = (
                "rejected",
                "kept training after the harness said stop (budget overrun)",
            )
            return "kill"
        if self.stop_sent_at is None and w.max_steps is not None and self.steps >= w.max_steps:
            return "stop"
        if now < self.deadline():
            return None
        if self.stop_sent_at is not None and not self.saved_since_stop:
            self.verdict = (
                "rejected",
                f"no checkpoint within {w.finish_limit_s:g}s of the stop: the "
                "scored state is the one at the stop (call save_checkpoint as soon as "
                "Clock.step() returns False)",
            )
            return "kill"
        if self.stop_sent_at is not None:
            self.verdict = (
                "timeout",
                f"still running {w.finish_limit_s}s after the harness said stop "
                "(budget overrun: stop at Clock.step() returning False, then save)",
            )
            return "kill"
        if self.timed_from is None:
            self.verdict = (
                "timeout",
                f"did not finish {w.untimed_steps} untimed steps within {w.startup_limit_s}s "
                "of starting (startup limit)",
            )
            return "kill"
        return "stop"


def _made(feed: Feed, rows: int, *, real: bool) -> np.ndarray:
    """``feed``'s batch: contiguous int32."""
    return np.ascontiguousarray(feed(rows, real), dtype=np.int32)


def _wire(batch: np.ndarray) -> memoryview:
    """``batch`` as the pipe carries it: the header, then its tokens as uint16 where all fit
    (half the bytes: a GPU-scale step's four batches of 64 rows then almost fit in the pipe at
    once, so the program reads them without waiting for this process to refill it), else int32."""
    narrow = bool(batch.size) and int(batch.min()) >= 0 and int(batch.max()) < 1 << 16
    tokens = batch.astype(np.uint16) if narrow else batch
    return memoryview(BATCH_HEADER.pack(*batch.shape, tokens.itemsize) + tokens.tobytes())


class _Pipes:
    """The harness's ends of the three pipes, and the data not yet written to the child."""

    def __init__(self) -> None:
        self.report_r, self.report_w = os.pipe()
        self.control_r, self.control_w = os.pipe()
        self.data_r, self.data_w = os.pipe()
        with contextlib.suppress(OSError):
            fcntl.fcntl(self.data_w, F_SETPIPE_SZ, PIPE_BYTES)
        os.set_blocking(self.data_w, False)
        self.pending: deque[memoryview] = deque()  # answers made, in order, not yet fully written
        self.buffer = b""
        self.eof = False
        self.ahead: deque[np.ndarray] = deque()  # real rows made before they were asked for
        self.last_rows = self.width = 0  # of the last real batch
        self.answers: deque[tuple[int, int]] = deque(maxlen=ANSWERS_KEPT)  # (bytes, real rows)

    def child_fds(self) -> dict[str, int]:
        return {
            REPORT_FD_ENV: self.report_w,
            CONTROL_FD_ENV: self.control_r,
            DATA_FD_ENV: self.data_r,
        }

    def close(self) -> None:
        """Close the harness's ends (the program is gone or will not run)."""
        for fd in (self.report_r, self.control_w, self.data_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def close_child_ends(self) -> None:
        for fd in self.child_fds().values():
            os.close(fd)

    def read_reports(self, watch: Watch, stamp: float) -> None:
        chunk = os.read(self.report_r, 65536)
        if not chunk:
            self.eof = True
            return
        self.buffer += chunk
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            watch.on_line(line[:MAX_LINE].decode(errors="replace"), stamp)
        self.buffer = self.buffer[-MAX_LINE:]

    def serve(self, watch: Watch, feed: Feed) -> None:
        """Write what the pipe takes of the answers made, then make the next answer asked for
        and write it too: one a call, so that a batch the program waits for is never held up
        by more than one being made (``run_timed`` comes back at once while ``to_make``)."""
        self._write()
        if self.to_make(watch):
            self.pending.append(self._answer(watch.requests.pop(0), watch, feed))
            self._write()

    def to_make(self, watch: Watch) -> bool:
        """A batch is asked for and not made, and fewer than ``MADE_AHEAD_BYTES`` wait to be
        written (a program asking for many cannot fill this process's memory)."""
        return bool(watch.requests) and sum(map(len, self.pending)) < MADE_AHEAD_BYTES

    def _write(self) -> None:
        """Write the answers made, in order, as far as the pipe takes them now."""
        with contextlib.suppress(BlockingIOError, BrokenPipeError):
            while self.pending:
                head = self.pending[0]
                written = os.write(self.data_w, head[: 1 << 20])
                if written < len(head):
                    self.pending[0] = head[written:]
                else:
                    self.pending.popleft()

    def _answer(self, rows: int, watch: Watch, feed: Feed) -> memoryview:
        """The answer to a request of ``rows``: a batch (real ones counted), or once the stop
        was sent the end of the data."""
        real = 0
        if watch.stop_sent_at is not None:
            answer = memoryview(BATCH_HEADER.pack(0, 0, 0))
        elif not watch.streaming:
            watch.synthetic_batches += 1
            answer = _wire(_made(feed, rows, real=False))
        else:
            batch = self._real_rows(rows, feed)
            watch.real_tokens += batch.shape[0] * (batch.shape[1] - 1)
            real, self.width = batch.shape
            self.last_rows = rows
            answer = _wire(batch)
        self.answers.append((len(answer), real))
        return answer

    def to_prepare(self, watch: Watch) -> int:
        """Rows ``prepare`` would make now: while real rows flow and nothing is asked, up to a
        step's worth of them (as many as the last step asked for) ahead, a batch (the last size
        asked) at a time."""
        if not watch.streaming or not self.last_rows or watch.requests:
            return 0
        most = MADE_AHEAD_BYTES // (4 * self.width)  # int32 rows: a program asking for many
        step = min(max(watch.rows_per_step, self.last_rows), most)  # cannot fill our memory
        return max(0, min(self.last_rows, step - sum(map(len, self.ahead))))

    def prepare(self, watch: Watch, feed: Feed) -> None:
        """Make real rows ahead (``to_prepare``) while the program trains, so that the next
        step's requests are answered at once instead of waiting for the feed. Rows keep their
        order; rows made but never asked for (the stop came) are never sent nor counted."""
        rows = self.to_prepare(watch)
        if rows:
            self.ahead.append(_made(feed, rows, real=True))

    def _real_rows(self, rows: int, feed: Feed) -> np.ndarray:
        """The next ``rows`` real rows: those made ahead first, then fresh ones from ``feed``."""
        parts, have = [], 0
        while self.ahead and have < rows:
            head = self.ahead.popleft()
            if have + len(head) > rows:
                self.ahead.appendleft(head[rows - have :])
                head = head[: rows - have]
            parts.append(head)
            have += len(head)
        if have < rows:
            parts.append(_made(feed, rows - have, real=True))
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def stop(self) -> None:
        with contextlib.suppress(OSError):  # the child may have closed its end
            os.write(self.control_w, b"s")

    def unread_tokens(self) -> int | None:
        """Real tokens sent (or queued to send) that the program never read, once it is gone:
        batches asked for ahead when the stop came. They are counted as sent, so they are
        taken off again (bytes still in the pipe, by FIONREAD, and not yet written); None when
        the pipe cannot say. Rows the stream read but held back (part of an answer larger than
        the program's next batch, when its sizes change) are not seen here."""
        if not self.width:
            return 0
        try:
            in_pipe = struct.unpack("i", fcntl.ioctl(self.data_w, termios.FIONREAD, bytes(4)))[0]
        except OSError:
            return None
        unread, rows = in_pipe + sum(map(len, self.pending)), 0  # the stream's last bytes
        for size, real in reversed(self.answers):  # the answers they hold, newest first
            if unread <= 0:
                break
            # an answer partly read had its header read: its rows not read in full are left
            rows += real if unread >= size else unread * real // (size - BATCH_HEADER.size)
            unread -= size
        return rows * (self.width - 1)


@dataclass(eq=False)
class Program:
    """A training program's process and the harness's ends of its pipes (from ``launch``)."""

    proc: subprocess.Popen
    pipes: _Pipes
    marker_var: str
    marker: str
    log_file: str
    started_at: float  # when it was launched, or (a waiting one) when it had its go
    go_w: int | None = None  # open while it waits for ``go``

    def go(self, message: Mapping[str, object]) -> None:
        """Let a program launched with ``waits`` run: ``stream.wait_for_go`` returns ``message``."""
        if self.go_w is None:
            raise RuntimeError("go is for a program launched with waits=True, once")
        with contextlib.suppress(BrokenPipeError):  # it died waiting: run_timed sees it exit
            os.write(self.go_w, (json.dumps(message) + "\n").encode())
        os.close(self.go_w)
        self.go_w = None
        self.started_at = time.monotonic()

    def cancel(self) -> None:
        """End a program that will not run (and its pipes)."""
        kill_group(self.proc)
        self.proc.wait()
        self.pipes.close()
        if self.go_w is not None:
            os.close(self.go_w)
            self.go_w = None


def launch(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    log_file: str,
    marker_var: str,
    preexec: Callable[[], None] | None = None,
    waits: bool = False,
) -> Program:
    """Start ``argv`` as a training program for ``run_timed``.

    Args:
        argv: the program's command (its output goes to ``log_file``).
        env: its environment; the pipes' fds and ``marker_var`` are added.
        log_file: where its output goes.
        marker_var: a variable put in its environment to find every process it starts.
        preexec: run in the child before exec (e.g. ``confine.hide_reads``).
        waits: the command is harness code that prepares (imports, a device) and then waits
            for ``Program.go`` before it runs the candidate's code (``stream.wait_for_go``):
            started before its job is known, its start-up is nobody's time.
    """
    pipes = _Pipes()
    marker = os.urandom(16).hex()
    child = pipes.child_fds()
    go_r = go_w = None
    if waits:
        go_r, go_w = os.pipe()
        child = {**child, GO_FD_ENV: go_r}
    full_env = {**env, marker_var: marker, **{k: str(v) for k, v in child.items()}}
    started_at = time.monotonic()
    with open(log_file, "wb") as log:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            pass_fds=tuple(child.values()),
            start_new_session=True,
            preexec_fn=preexec,
        )
    pipes.close_child_ends()
    if go_r is not None:
        os.close(go_r)
    return Program(proc, pipes, marker_var, marker, log_file, started_at, go_w)


def run_timed(
    program: Program,
    *,
    window: Window,
    feed: Feed,
    on_saved: Callable[[], dict] = dict,
    ignore_leftovers: tuple[str, ...] = (),
    write_dir: str = ".",
    progress: Callable[[int, float | None], None] | None = None,
    on_initial: Callable[[], None] | None = None,
) -> dict:
    """Watch ``program`` (``launch``; a waiting one after its ``go``) as the timed training
    program; return the verdict (without the nonce).

    Args:
        program: the launched program.
        window: the timed window's settings.
        feed: makes the batches the program asks for.
        on_saved: called when the program reports its checkpoint; its dict (e.g. the
            checkpoint's digest, and ``bytes``: its size, for ``Watch.judge_save``) goes into
            the verdict as ``checkpoint``.
        ignore_leftovers: command-line words of leftovers that are killed but not held
            against it (e.g. torch.compile's worker pool).
        write_dir: where the harness measures a checkpoint-sized write, when it must
            (``savetime``): a folder on the checkpoint's filesystem.
        progress: called with the steps reported so far and the latest loss (or None) when
            steps arrive while the clock runs (e.g. to tell the log how training goes).
        on_initial: called once, when the program's first ``initial`` report comes before
            the clock starts (its initial checkpoint is written); a later report, or one
            after the clock started, is ignored (work begun then would overlap nothing
            the program was not already charged for).
    """
    if program.go_w is not None:
        raise RuntimeError("a program launched with waits=True runs once it had its go")
    pipes, proc, start = program.pipes, program.proc, program.started_at
    watch, checkpoint, ended = Watch(window, start), {}, False
    while True:
        now = time.monotonic()
        action = watch.check(now)
        if action == "stop":
            # Take in every line already written: steps reported before the stop byte must
            # not count as steps after it.
            while not pipes.eof and select.select([pipes.report_r], [], [], 0)[0]:
                pipes.read_reports(watch, now)
            watch.stop_sent_at = time.monotonic()
            pipes.stop()
            continue
        if action == "kill":
            kill_group(proc)
            break
        if pipes.eof:
            if proc.poll() is not None:
                break
            time.sleep(min(0.05, max(0.0, watch.deadline() - now)))
            continue
        writers = [pipes.data_w] if pipes.pending else []
        quiet = PREPARE_WHEN_QUIET_S if pipes.to_prepare(watch) else 0.5
        wait = 0.0 if pipes.to_make(watch) else max(0.0, min(quiet, watch.deadline() - now))
        ready, writable, _ = select.select([pipes.report_r], writers, [], wait)
        if ready:
            saves, steps, initial = watch.saves, watch.steps, watch.initial_before_clock
            pipes.read_reports(watch, time.monotonic())
            if on_initial is not None and initial is None and watch.initial_before_clock:
                on_initial()
            if progress is not None and watch.steps != steps and watch.streaming:
                progress(watch.steps, watch.loss)
            if watch.saves != saves:
                checkpoint = on_saved()
                watch.judge_save(int(checkpoint.get("bytes", 0)), write_dir)
            if watch.verdict is not None:  # a checkpoint reported too late
                kill_group(proc)
                break
            if watch.done:  # the checkpoint (and profile) is in: its exit is not waited for
                ended = True
                kill_group(proc)
                break
        if ready or writable or watch.requests:
            pipes.serve(watch, feed)
        else:  # quiet for a while: the program is not starting a step, reading or asking
            pipes.prepare(watch, feed)
        if (
            not ready
            and proc.poll() is not None
            and not select.select([pipes.report_r], [], [], 0)[0]
        ):
            break
    end = time.monotonic()
    returncode = proc.wait()
    kill_group(proc)  # anything the child left in its process group goes with it
    leftover = reap_tree(
        f"{program.marker_var}={program.marker}".encode(), LEFTOVER_GRACE_S, ignore_leftovers
    )
    unread = pipes.unread_tokens()
    watch.real_tokens -= unread or 0
    pipes.close()
    verdict = _verdict(watch, checkpoint, returncode, ended, leftover, start, end, program.log_file)
    verdict["unread_tokens"] = unread  # taken off ``tokens``; None: the pipe could not say
    verdict["marks"] = {  # monotonic times of the run's boundaries, for the evaluation's phases
        "launched": start,
        "first_batch": watch.first_batch_at,
        "timed_from": watch.timed_from,
        "stopped": watch.stop_sent_at,
        "saved": watch.saved_at,
        "exited": end,
        "reaped": time.monotonic(),
    }
    verdict["profile"] = watch.profile
    return verdict


def _verdict(
    watch: Watch,
    checkpoint: dict,
    returncode: int,
    ended: bool,
    leftover: list[str],
    start: float,
    end: float,
    log_file: str,
) -> dict:
    timed = watch.timed_from is not None
    result = {
        "steps": watch.steps,
        "tokens": watch.real_tokens,
        "reported_tokens": watch.reported_tokens,
        "synthetic_batches": watch.synthetic_batches,
        "startup_s": (watch.timed_from if timed else end) - start,
        "training_s": (watch.last_step_at - watch.timed_from)
        if timed and watch.last_step_at
        else 0.0,
        "total_s": end - start,
        "stopped_by_harness": watch.stop_sent_at is not None,
        "stop_to_save_s": (watch.saved_at - watch.stop_sent_at)
        if watch.saved_since_stop and watch.stop_sent_at is not None
        else None,
        "save_allowed_s": watch.save_allowance.total_s if watch.save_allowance else None,
        "startup_charged_s": watch.charged_s(),
        "returncode": returncode,
        "ended_by_harness": ended,
        "notes": watch.notes,
        "violations": watch.violations[:10],
        "checkpoint": checkpoint,
        "log_tail": tail(log_file),
        "leftover": leftover,
    }
    if watch.window.max_steps is not None:
        # Reported by the candidate: a short run that lies about its loss only passes a
        # quick check; the full run that follows is scored by the harness's scorer anyway.
        result["losses"] = watch.losses
    if watch.verdict is not None:
        result["status"], result["reason"] = watch.verdict
    elif leftover:
        result["status"], result["reason"] = (
            "rejected",
            f"the training program left {len(leftover)} process(es) running after it exited "
            "(killed): " + "; ".join(leftover[:3]),
        )
    elif returncode != 0 and not ended:  # a program the harness ended has no exit status of its own
        result["status"], result["reason"] = (
            "error",
            f"training program exited with status {returncode}",
        )
    else:  # stopping before the budget is allowed: it only costs the candidate training time
        result["status"], result["reason"] = "ok", ""
    return result
