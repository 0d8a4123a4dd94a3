"""How long a training program may take from the harness's stop to its checkpoint report, measured here.

What is scored is the state at the stop, so the time between the stop and the checkpoint
report must hold no training. It holds two honest things: the rest of the step that was
running when the stop came (the program learns of the stop when that step ends), and the
checkpoint's write. The allowance is made of exactly these, measured by the harness:

- ``floor_s``, the scale's fixed floor (the save's Python work and the machine's jitter:
  ``benchmarks/nanochat/RESULTS.md`` has the measurements behind each scale's);
- the program's typical step (the median interval between its timed step reports, on the
  harness's clock), at most ``floor_s``: a program whose reports are far apart cannot buy a
  longer window with them;
- ``WRITE_FACTOR`` times the time this machine takes, now, to write as many bytes as the
  checkpoint holds (``write_seconds``). It is measured only when the report came later than
  the first two terms allow, so a small checkpoint never pays for the measurement.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

WRITE_FACTOR = 4.0  # the write measured here is raw bytes; torch.save pickles and zips them too
CHUNK_BYTES = 1 << 22


def write_seconds(n_bytes: int, folder: Path | str) -> float:
    """Seconds this machine takes now to write ``n_bytes`` into a new file in ``folder`` (as a
    checkpoint's save does: into the page cache, no fsync); the file is removed afterwards."""
    chunk = os.urandom(min(max(n_bytes, 1), CHUNK_BYTES))
    fd, name = tempfile.mkstemp(prefix=".write-probe-", dir=folder)
    began = time.monotonic()
    try:
        left = n_bytes
        while left > 0:
            left -= os.write(fd, memoryview(chunk)[: min(left, len(chunk))])
        return time.monotonic() - began
    finally:
        os.close(fd)
        os.unlink(name)


def typical_step_s(step_stamps: Sequence[float]) -> float:
    """The median interval between consecutive step reports (0 with fewer than two)."""
    if len(step_stamps) < 2:
        return 0.0
    return statistics.median(b - a for a, b in zip(step_stamps, step_stamps[1:], strict=False))


@dataclass(frozen=True, kw_only=True)
class SaveAllowance:
    """The seconds a checkpoint report may come after the stop, and what they are made of."""

    floor_s: float
    step_s: float  # the step in flight: the typical step, at most floor_s
    write_s: float | None = None  # WRITE_FACTOR times the measured write, when measured

    @classmethod
    def of(cls, *, floor_s: float, step_stamps: Sequence[float]) -> SaveAllowance:
        """The allowance before any write is measured."""
        return cls(floor_s=floor_s, step_s=min(typical_step_s(step_stamps), floor_s))

    @property
    def total_s(self) -> float:
        return self.floor_s + self.step_s + (self.write_s or 0.0)

    def with_write(self, n_bytes: int, folder: Path | str) -> SaveAllowance:
        """This allowance with the write of ``n_bytes`` measured in ``folder`` added."""
        return SaveAllowance(floor_s=self.floor_s, step_s=self.step_s,
                             write_s=WRITE_FACTOR * write_seconds(n_bytes, folder))  # fmt: skip

    def describe(self) -> str:
        parts = [f"a floor of {self.floor_s:g}s", f"a step in flight of {self.step_s:.2f}s"]
        if self.write_s is not None:
            parts.append(f"{WRITE_FACTOR:g} x the {self.write_s / WRITE_FACTOR:.3f}s this machine "
                         "takes to write the checkpoint's bytes")  # fmt: skip
        return f"{self.total_s:.2f}s: " + " + ".join(parts)
