"""The harness side of the clock: unix-socket servers, the one that timestamps the candidate's marks, and their audit.

Times come from this (the harness's) process, taken when a mark arrives; the candidate
only says *that* something happened, never *when*. ``audit`` turns the marks into the
timed training seconds or a ``ClockViolation`` naming the broken rule.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ClockViolation(Exception):
    """The candidate's marks break a timing rule; the message is the reason shown to it."""


@dataclass(frozen=True)
class Mark:
    """One mark as the harness received it: the event, the harness's time, what came with it."""

    event: str
    t: float
    fields: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Timing:
    """The audited timing of one run (seconds on the harness's monotonic clock)."""

    train_s: float  # start to stop, minus calibration pauses
    untimed_s: float  # launch to start: startup, compilation, warm-up
    start_t: float
    stop_t: float
    init_sha256: str
    final_sha256: str
    probes: tuple[tuple[float, str, str], ...] = ()  # (training seconds, file name, sha256)


class UnixServer:
    """A unix-socket server in a short-lived folder of its own; each connection is handed to ``accepted``.

    A filesystem socket, because the sandbox gives the candidate its own network namespace
    (TCP to the harness is impossible) while a socket file stays reachable. Use as a context
    manager; ``address`` (the socket's path) goes to the candidate.
    """

    NAME = "socket"

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._folder: str | None = None

    @property
    def address(self) -> str:
        assert self._folder is not None, f"use {type(self).__name__} as a context manager"
        return str(Path(self._folder) / self.NAME)

    def __enter__(self) -> UnixServer:
        self._folder = tempfile.mkdtemp(prefix="speedrun-", dir="/tmp")  # paths over 107 bytes fail
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.address)
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        if self._thread:
            self._thread.join(timeout=5)
        if self._sock:
            self._sock.close()
        if self._folder:
            shutil.rmtree(self._folder, ignore_errors=True)

    def _serve(self) -> None:
        assert self._sock is not None
        while not self._closing.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted(conn)

    def accepted(self, conn: socket.socket) -> None:
        """Serve one connection (in a thread of its own, if it lasts)."""
        raise NotImplementedError


class ClockServer(UnixServer):
    """Records marks from one connection (rank 0); ``address`` goes to the candidate as ``SPEEDRUN_CLOCK``."""

    EVENTS = ("warmup_begin", "start", "pause", "resume", "stop")
    NAME = "clock"

    def __init__(self) -> None:
        super().__init__()
        self.marks: list[Mark] = []
        self.problems: list[str] = []
        self.started = threading.Event()  # set when the start mark arrives
        self._connections = 0

    def phase(self) -> str:
        """Where the run is: "before" the start mark, "running", or "after" the stop mark."""
        events = {m.event for m in self.marks}
        return "after" if "stop" in events else "running" if "start" in events else "before"

    def accepted(self, conn: socket.socket) -> None:
        self._connections += 1
        if self._connections > 1:
            self.problems.append("a second connection to the clock (only rank 0 may mark time)")
            conn.close()
            return
        threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        conn.settimeout(0.2)
        buffer = b""
        with conn:
            while not self._closing.is_set():
                try:
                    chunk = conn.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    return
                now = time.monotonic()
                if not chunk:
                    return
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    reply = self._record(line, now)
                    with contextlib.suppress(OSError):
                        conn.sendall(reply.encode() + b"\n")

    def _record(self, line: bytes, now: float) -> str:
        try:
            message = json.loads(line)
            event = message.pop("event")
        except (ValueError, KeyError, AttributeError):
            self.problems.append(f"an unreadable clock message: {line[:200]!r}")
            return "error: unreadable message"
        if event not in self.EVENTS:
            self.problems.append(f"an unknown clock event {event!r}")
            return f"error: unknown event {event!r}"
        self.marks.append(Mark(event=str(event), t=now, fields=message))
        if event == "start":
            self.started.set()
        return "ok"


def init_sha256(marks: list[Mark]) -> str | None:
    """The digest the candidate's clock gave for the initial checkpoint, saved at its first mark
    (``warmup_begin``, else ``start``)."""
    by_event = {m.event: m for m in marks}
    first = by_event.get("warmup_begin") or by_event.get("start")
    given = (first.fields.get("init_sha256") if first else None) or (
        by_event["start"].fields.get("init_sha256") if "start" in by_event else None
    )
    return None if given is None else str(given)


def audit(
    marks: list[Mark],
    problems: list[str],
    *,
    launch_t: float,
    warmup_cap_s: float,
    allow_probes: bool = False,
) -> Timing:
    """Check the marks against the rules and return the timing.

    Rules: marks come as ``[warmup_begin] start (pause resume)* stop``; the state at
    ``start`` equals the state at ``warmup_begin``; launch to ``start`` takes at most
    ``warmup_cap_s``; pauses only when the harness asked for probes.

    Raises:
        ClockViolation: with the reason.
    """
    if problems:
        raise ClockViolation("; ".join(problems))
    events = [m.event for m in marks]
    if "start" not in events:
        raise ClockViolation(
            "the clock was never started: call speedrun_clock.start(model, optimizer) before training"
        )
    if "stop" not in events:
        raise ClockViolation(
            "the clock was never stopped: call speedrun_clock.stop(model) after the last step"
        )
    grammar_ok = events[-1] == "stop" and events.count("stop") == 1 and events.count("start") == 1
    body = events[events.index("start") + 1 : -1]
    grammar_ok &= events[: events.index("start")] in ([], ["warmup_begin"])
    grammar_ok &= body == ["pause", "resume"] * (len(body) // 2)
    if not grammar_ok:
        raise ClockViolation(
            f"clock marks out of order: {' -> '.join(events)}; expected [warmup_begin] -> start -> stop, each once"
        )
    if body and not allow_probes:
        raise ClockViolation(
            "the clock was paused; pauses are only for the harness's calibration runs"
        )
    by_event = {m.event: m for m in marks}
    start, stop = by_event["start"], by_event["stop"]
    if "warmup_begin" in by_event and by_event["warmup_begin"].fields.get(
        "state"
    ) != start.fields.get("state"):
        raise ClockViolation(
            "the warm-up changed the model or optimizer state and did not restore it: the state checksum at "
            "start differs from the one at warmup_begin (save the state before warm-up and load it back)"
        )
    untimed = start.t - launch_t
    if untimed > warmup_cap_s:
        raise ClockViolation(
            f"startup and untimed warm-up took {untimed:.1f} s, over the cap of {warmup_cap_s:.0f} s; "
            "compile less or warm up with fewer steps"
        )
    init_sha = init_sha256(marks)
    paused = 0.0
    probes = []
    for pause, resume in zip(
        marks[events.index("start") + 1 : -1 : 2],
        marks[events.index("start") + 2 : -1 : 2],
        strict=True,
    ):
        paused += resume.t - pause.t
        probes.append(
            (
                pause.t - start.t - (paused - (resume.t - pause.t)),
                str(resume.fields.get("path")),
                str(resume.fields.get("sha256")),
            )
        )
    return Timing(
        train_s=stop.t - start.t - paused,
        untimed_s=untimed,
        start_t=start.t,
        stop_t=stop.t,
        init_sha256=str(init_sha),
        final_sha256=str(stop.fields.get("sha256")),
        probes=tuple(probes),
    )
