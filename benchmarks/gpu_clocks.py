"""A GPU's clocks, power and temperature sampled while a measurement runs (``nvidia-smi``).

Speed compared between two runs (e.g. a program under the harness and the same program run
bare) says something about the programs only when the GPU ran at the same clocks: under
sustained load an H200 lowers its SM clock at its power or thermal limit, and every kernel
then takes longer, whoever launched it. ``sampled(gpu)`` reads ``nvidia-smi`` every half
second while its block runs; ``Samples.summary`` gives the clocks while the GPU was busy
(utilisation at least ``BUSY``), to print next to the speed they qualify.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

QUERY = "utilization.gpu,clocks.sm,power.draw,temperature.gpu"
BUSY = 90  # utilisation (%) from which a sample counts as the GPU at work


@dataclass(frozen=True)
class Reading:
    """One sample: utilisation (%), SM clock (MHz), power (W), temperature (C)."""

    busy: float
    sm_mhz: float
    power_w: float
    temperature_c: float


def parse(line: str) -> Reading | None:
    """A ``--format=csv,noheader,nounits`` line of ``QUERY``; None for one that is not (an error,
    a field the driver reports as ``[N/A]``)."""
    try:
        return Reading(*(float(part) for part in line.split(",")))
    except (TypeError, ValueError):
        return None


@dataclass
class Samples:
    """The readings taken while a ``sampled`` block ran; ``error`` when there were none to take."""

    readings: list[Reading] = field(default_factory=list)
    error: str = ""

    def summary(self) -> dict:
        """Median and lowest SM clock, mean power and highest temperature of the busy samples."""
        busy = [r for r in self.readings if r.busy >= BUSY]
        if not busy:
            return {"samples": len(self.readings), "busy_samples": 0, "error": self.error or
                    f"no sample with the GPU at least {BUSY}% busy"}  # fmt: skip
        return {
            "samples": len(self.readings),
            "busy_samples": len(busy),
            "sm_mhz_median": statistics.median(r.sm_mhz for r in busy),
            "sm_mhz_min": min(r.sm_mhz for r in busy),
            "power_w_mean": statistics.fmean(r.power_w for r in busy),
            "temperature_c_max": max(r.temperature_c for r in busy),
        }


def physical_id(gpu: str) -> str:
    """``nvidia-smi``'s id of this process's GPU ``gpu`` (an index into CUDA_VISIBLE_DEVICES)."""
    listed = [g.strip() for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    return listed[int(gpu)] if listed and gpu.isdigit() and int(gpu) < len(listed) else gpu


@contextlib.contextmanager
def sampled(gpu: str | None, period_ms: int = 500) -> Iterator[Samples]:
    """Within the block, ``nvidia-smi`` samples GPU ``gpu``; the yielded ``Samples`` fill as it runs."""
    samples = Samples()
    command = shutil.which("nvidia-smi")
    if gpu is None or command is None:
        samples.error = "no GPU" if gpu is None else "nvidia-smi not found"
        yield samples
        return
    proc = subprocess.Popen(
        [command, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
         "-i", physical_id(gpu), "-lms", str(period_ms)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip

    def read() -> None:
        for line in proc.stdout:
            reading = parse(line)
            if reading is None:
                samples.error = line.strip()[:200]
            else:
                samples.readings.append(reading)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield samples
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        reader.join(timeout=5)


def describe(summary: dict) -> str:
    """A ``Samples.summary`` in words: the busy samples' SM clock, power and temperature."""
    if not summary.get("busy_samples"):
        return f"clocks not sampled ({summary.get('error', 'no samples')})"
    return (
        f"SM clock median {summary['sm_mhz_median']:.0f} MHz (lowest {summary['sm_mhz_min']:.0f}), "
        f"{summary['power_w_mean']:.0f} W, up to {summary['temperature_c_max']:.0f} C"
    )
