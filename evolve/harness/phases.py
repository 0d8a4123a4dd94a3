"""Where an evaluation's wall time goes: one timeline of named phases, cut at their boundaries.

``evolve.harness.fitness.evaluate_safely`` opens a timeline for each evaluation (``timeline``) and the
code it runs marks where a phase begins (``mark``): a benchmark's fitness, at each boundary
it crosses or learns of afterwards (a harness process reports monotonic times of its own,
e.g. when the candidate's clock started). Each mark ends the phase before it in time, so
the phases cover the evaluation with no gap and no overlap, and their seconds add up to its
``wall_s``; a phase marked several times (e.g. per seed) adds up. ``mark`` outside a
timeline does nothing, so measurement scripts may call a fitness directly. Within
``reported``, each phase is also told as it begins, so a long evaluation can say what it is
doing while it runs (the local backend's log lines), and ``detail`` tells how the phase goes
(e.g. a training step and loss, which a harness process reported), at most every ``DETAIL_EVERY_S``.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

PREFIX = "time_"
"""Phases are stored in an evaluation's metrics as ``time_<phase>`` seconds."""
DETAIL_EVERY_S = 5.0
"""``detail`` tells at most one detail in this many seconds (a training step's pace is no concern of the log)."""
NAME = re.compile(r"[a-z]+(_[a-z]+)*")
"""A phase's name: lowercase words joined by ``_``, never ending in ``_s``, so that other metrics
named ``time_..._s`` or ``time_s_<i>`` (plain seconds, e.g. speedrun's) are never taken for phases."""


def is_phase(metric: str) -> bool:
    """True when ``metric`` names a phase's seconds (``time_<phase>``)."""
    name = metric.removeprefix(PREFIX)
    return name != metric and NAME.fullmatch(name) is not None and not name.endswith("_s")


def slug(text: str) -> str:
    """A phase name made from free text (e.g. a stage's name): "Short run 2" -> "short_run"."""
    name = re.sub(r"[^a-z]+", "_", text.lower()).strip("_").removesuffix("_s")
    return name or "stage"


class Timeline:
    """Named phases from ``start``: each ``mark`` begins one at its time and ends the one before."""

    def __init__(self, first: str, start: float) -> None:
        self.start = start
        self._marks: list[tuple[float, int, str]] = [(start, 0, first)]
        self.now_in = first  # the phase last told as it began
        self.detailed_at = -math.inf  # when ``detail`` last told one

    def mark(self, name: str, at: float | None = None) -> None:
        """Phase ``name`` begins at ``at`` (monotonic seconds, the same clock in every process
        of this machine; default now). Marks may come in any order: a boundary learnt later
        (a harness process's report) falls into place; one before the start counts from it."""
        if not is_phase(PREFIX + name):
            raise ValueError(
                f"phase name {name!r}: use lowercase words joined by '_', not ending in '_s'"
            )
        when = max(self.start, time.monotonic() if at is None else at)
        self._marks.append((when, len(self._marks), name))

    def seconds(self, end: float) -> dict[str, float]:
        """Seconds per phase from the start until ``end``, in the order the phases first began."""
        ordered = sorted(self._marks)
        totals: dict[str, float] = {}
        bounds = [*(min(at, end) for at, _, _ in ordered[1:]), end]
        for (begin, _, name), finish in zip(ordered, bounds, strict=True):
            totals[name] = totals.get(name, 0.0) + max(0.0, finish - min(begin, end))
        return totals


_current: contextvars.ContextVar[Timeline | None] = contextvars.ContextVar(
    "evolve_phases", default=None
)


_listener: contextvars.ContextVar[Callable[[str, str], None] | None] = contextvars.ContextVar(
    "evolve_phase_listener", default=None
)


@contextlib.contextmanager
def reported(listener: Callable[[str, str], None]) -> Iterator[None]:
    """Within the block, ``listener(phase, "")`` hears each phase of an evaluation as it begins (a
    timeline's first and each ``mark`` made now: a boundary learnt afterwards is not news), and
    ``listener(phase, detail)`` each ``detail`` told of the phase it is in."""
    token = _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(token)


def _tell(name: str, detail: str = "") -> None:
    listener = _listener.get()
    if listener is not None:
        listener(name, detail)


@contextlib.contextmanager
def timeline(first: str, start: float | None = None) -> Iterator[Timeline]:
    """Within the block, ``mark`` cuts this timeline, which begins with phase ``first``."""
    line = Timeline(first, time.monotonic() if start is None else start)
    token = _current.set(line)
    _tell(first)
    try:
        yield line
    finally:
        _current.reset(token)


def mark(name: str, at: float | None = None) -> None:
    """Phase ``name`` of the current evaluation begins at ``at`` (default now); nothing outside one."""
    line = _current.get()
    if line is not None:
        line.mark(name, at)
        if at is None:
            line.now_in, line.detailed_at = name, -math.inf
            _tell(name)


def detail(text: str) -> None:
    """Tell how the current evaluation's phase goes (e.g. "step 120, loss 3.41", text the harness
    wrote), unless one was told less than ``DETAIL_EVERY_S`` ago in this phase; nothing outside one."""
    line = _current.get()
    now = time.monotonic()
    if line is not None and now >= line.detailed_at + DETAIL_EVERY_S:
        line.detailed_at = now
        _tell(line.now_in, text)


def mark_each(boundaries: Iterable[tuple[str, float | None]]) -> None:
    """``mark`` each (phase, time) in order, skipping those whose time is None (never reached)."""
    for name, at in boundaries:
        if at is not None:
            mark(name, at)


def summed(metric_sets: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """The ``time_<phase>`` metrics of several evaluations added up (for a verdict whose wall_s is their sum)."""
    totals: dict[str, float] = {}
    for values in metric_sets:
        for key, value in values.items():
            if is_phase(key) and isinstance(value, int | float):
                totals[key] = totals.get(key, 0.0) + float(value)
    return totals


def metrics(seconds: dict[str, float]) -> dict[str, float]:
    """``{"time_<phase>": seconds}`` for an evaluation's metrics."""
    return {PREFIX + name: value for name, value in seconds.items()}
