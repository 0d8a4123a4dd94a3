"""GPU timing of one callable in this process: warm-up, timed runs with fresh arguments, L2 flushed before each.

Used by the harness's own processes for the reference (``referee.py``'s ``timers`` diagnostic,
``harness_tax``'s bare times); a candidate is timed from another process (``timer.py``).

Every iteration gets arguments from ``setup(i)`` (fresh inputs and fresh output buffers,
so nothing computed earlier can be reused), then the L2 cache is flushed by zeroing a
buffer of twice its size, then the call runs between two CUDA events (GPU time only;
setup and flush sit before the start event). Before the start event the GPU also spins
for ``HEAD_START_CYCLES``, so that the call's kernel launches are already queued when the
clock starts: the time is the GPU's execution, not Python launch overhead (which CUPTI
timing in SOL-ExecBench excludes the same way). On a CPU device (tests) the host clock stands
in for the events.

``method="cupti"`` (SOL-ExecBench's default timer) takes each call's time from CUPTI
activity records instead: the span from the first kernel/memcpy/memset the call starts
to the last one it ends, through the ``cupti-python`` package (``pip install
cupti-python``; the ``kernels`` extra). It excludes event-record overhead, which upstream
measured at 6-10 us, and matters for workloads of a few microseconds. Without the
package, ``resolve_timer`` answers "events" and the report says so.

CUPTI sees the activities of every stream of the process; CUDA events see only the stream
they are recorded on.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

try:
    from cupti import cupti as _CUPTI
except ImportError:
    _CUPTI = None

_EVENT = torch.cuda.Event
_RECORD = torch.cuda.Event.record
_ELAPSED = torch.cuda.Event.elapsed_time
_SYNC = torch.cuda.synchronize
_NOW_NS = time.perf_counter_ns
_SPIN = getattr(torch.cuda, "_sleep", None)  # a kernel that spins for a number of GPU clock cycles
FALLBACK_L2_BYTES = 64 << 20
# About 1 ms at H200 clocks (1.98 GHz): longer than torch.compile's guard-and-launch path even
# on a busy host. With 0.1 ms, the compiled baselines of 10-40 us workloads varied by up to 2x
# between runs on a host loaded by other jobs (CV of T_b up to 32%, kernels/RESULTS.md) while
# the Triton seeds' single launches stayed under 1%. The likely cause, the clock catching the
# launch path, is what this longer head start removes; to be confirmed on a GPU.
HEAD_START_CYCLES = 2_000_000
# The head start lasts ~1 ms on any clock up to 10 GHz: a shorter first activity is not it.
HEAD_START_NS_MIN = 200_000


def l2_bytes(device: torch.device) -> int:
    """The device's L2 cache size in bytes (a generous default where torch cannot tell)."""
    if device.type != "cuda":
        return 0
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0) or FALLBACK_L2_BYTES)


def synchronize(device: torch.device) -> None:
    """Wait for all work on ``device`` (no-op on CPU)."""
    if device.type == "cuda":
        _SYNC(device)


class CuptiUnavailable(RuntimeError):
    """CUPTI could not start here (driver or library mismatch); CUDA events are used instead."""


_USED: dict[str, str] = {}  # the timer the last measure() really used (the referee reports it)


def last_timer() -> str:
    """The timer of the last ``measure`` call: cupti, events, host, or events with why CUPTI failed."""
    return _USED.get("timer", "")


def last_activities() -> int | None:
    """GPU activities (kernels, copies, sets) per call in the last CUPTI measurement (its median)."""
    return int(_USED["activities"]) if "activities" in _USED else None


def resolve_timer(method: str, device: torch.device) -> str:
    """The timer that will really be used: "cupti" only on a GPU with cupti-python importable."""
    if method != "cupti" or device.type != "cuda":
        return "events" if device.type == "cuda" else "host"
    return "events" if _CUPTI is None else "cupti"


def _measure_cupti(fn: Callable[..., Any], setup: Callable[[int], Sequence[Any]], flush: torch.Tensor | None,
                   iters: int, device: torch.device) -> list[float]:  # fmt: skip
    """Per call: the GPU span of its activities (ns clock of CUPTI), calls separated by syncs.

    Each call is launched behind the same head start as the events path, so a reference made
    of several kernels is timed as they run back to back on the GPU, not with the host's
    launch gaps between them (measured on the H200 before this: eager references of 25-40 us
    by events spanned 80-130 us under CUPTI). An activity belongs to the call whose window
    (host timestamps around the call, between two device syncs) it starts in; the window's
    first activity is the head start, dropped after checking that it lasted as one.
    """
    cupti = _CUPTI
    kinds = (
        cupti.ActivityKind.CONCURRENT_KERNEL,
        cupti.ActivityKind.MEMCPY,
        cupti.ActivityKind.MEMSET,
    )
    records: list[tuple[int, int]] = []

    def completed(activities: list) -> None:
        records.extend((int(a.start), int(a.end)) for a in activities)

    try:
        # A torch profiler run earlier in this process (harness_tax profiles the kernels a call
        # launches just before it times) leaves kineto's CUPTI state behind: timed under it, the
        # rmsnorm seed ran 2.1x slower on the H200 (kernels/RESULTS.md, 2026-12-01), and the next
        # window after a finalize ran at bare speed. So each window starts from a detached CUPTI.
        cupti.finalize()
        for kind in kinds:
            cupti.activity_enable(kind)
        cupti.activity_register_callbacks(lambda: (8 << 20, 0), completed)
    except Exception as exc:  # another subscriber (a profiler), no permission, driver mismatch
        with contextlib.suppress(Exception):
            cupti.finalize()
        raise CuptiUnavailable(f"{type(exc).__name__}: {exc}") from exc
    windows = []
    try:
        for i in range(iters):
            args = setup(i)
            if flush is not None:
                flush.zero_()
            _SYNC(device)
            begin = int(cupti.get_timestamp())
            # the call's launches queue behind the head start: no host gaps inside the span
            if _SPIN is not None:
                _SPIN(HEAD_START_CYCLES)
            fn(*args)
            _SYNC(device)
            windows.append((begin, int(cupti.get_timestamp())))
        cupti.activity_flush_all(1)
    finally:
        for kind in kinds:
            cupti.activity_disable(kind)
        cupti.finalize()
    return _spans(sorted(records), windows)


def _spans(records: Sequence[tuple[int, int]], windows: Sequence[tuple[int, int]]) -> list[float]:
    """Milliseconds from the first to the last activity of each window, its head start dropped."""
    times, counts = [], []
    for begin, end in windows:
        inside = [r for r in records if begin <= r[0] < end]
        if _SPIN is not None:
            if not inside or inside[0][1] - inside[0][0] < HEAD_START_NS_MIN:
                raise RuntimeError("CUPTI lost the head start's record of a timed call")
            inside = inside[1:]
        if not inside:
            raise RuntimeError("CUPTI recorded no GPU activity for a timed call")
        times.append((max(r[1] for r in inside) - inside[0][0]) / 1e6)
        counts.append(len(inside))
    _USED["activities"] = str(int(statistics.median(counts)))
    return times


def measure(
    fn: Callable[..., Any],
    setup: Callable[[int], Sequence[Any]],
    *,
    device: torch.device,
    warmup: int = 10,
    iters: int = 50,
    flush_l2: bool = True,
    method: str = "events",
) -> list[float]:
    """Milliseconds of each of ``iters`` timed calls ``fn(*setup(i))`` after ``warmup`` untimed ones.

    ``method`` is "events" or "cupti" (see ``resolve_timer`` for which one runs).
    """
    _USED.pop("activities", None)
    flush = (
        torch.empty(2 * l2_bytes(device), dtype=torch.int8, device=device)
        if flush_l2 and device.type == "cuda"
        else None
    )
    for i in range(warmup):
        args = setup(-1 - i)
        if flush is not None:
            flush.zero_()
        fn(*args)
    synchronize(device)
    if device.type != "cuda":
        _USED["timer"] = "host"
        times = []
        for i in range(iters):
            args = setup(i)
            start = _NOW_NS()
            fn(*args)
            times.append((_NOW_NS() - start) / 1e6)
        return times
    _USED["timer"] = resolve_timer(method, device)
    if _USED["timer"] == "cupti":
        try:
            return _measure_cupti(fn, setup, flush, iters, device)
        except CuptiUnavailable as exc:
            _USED["timer"] = f"events (cupti unavailable: {str(exc)[:200]})"
    starts = [_EVENT(enable_timing=True) for _ in range(iters)]
    ends = [_EVENT(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        args = setup(i)
        if flush is not None:
            flush.zero_()
        if _SPIN is not None:
            _SPIN(HEAD_START_CYCLES)
        _RECORD(starts[i])
        fn(*args)
        _RECORD(ends[i])
    _SYNC(device)
    return [float(_ELAPSED(s, e)) for s, e in zip(starts, ends, strict=True)]


def median(times: Sequence[float]) -> float:
    """The median of a list of times."""
    return float(statistics.median(times))
