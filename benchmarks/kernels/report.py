"""What a kernel evaluation reports: per-workload rows and the candidate's report (status, score, table)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(kw_only=True)
class WorkloadRow:
    """One workload's measurements and score (times in ms)."""

    uuid: str
    status: str = "ok"
    message: str = ""
    kernel_ms: float | None = None
    reference_ms: float | None = None
    baseline_ms: float | None = None
    sol_ms: float | None = None
    memory_ms: float | None = None
    compute_ms: float | None = None
    score: float | None = None
    cv: float | None = None
    repeat_medians: list[float] = field(default_factory=list)
    flagged: bool = False
    flops_method: str = ""  # how T_SOL's FLOPs were found: sol.json, meta, real (fallback) or none
    published_baseline_ms: float | None = None
    published_sol_ms: float | None = None
    published_score: float | None = None  # T_k here against upstream's published T_b and T_SOL
    bytes: float | None = None  # unavoidable traffic: inputs read once, outputs written once
    flops: dict[str, float] = field(default_factory=dict)  # matrix FLOPs per operand dtype


@dataclass(kw_only=True)
class Report:
    """A candidate's result on one problem: status (ok, invalid, error, cheat), rows, score."""

    problem: str
    status: str = "ok"
    message: str = ""
    rows: list[WorkloadRow] = field(default_factory=list)
    score: float = 0.0
    # Upstream's mode: the same T_k against the published per-workload T_b and T_SOL (None when
    # the dataset carries no published times for every workload). Comparable with published
    # scores only when measured on ``published_hardware``.
    published_score: float | None = None
    published_hardware: str = ""
    kernels: dict[str, int] = field(default_factory=dict)
    output: str = ""
    timer: str = ""  # the timer the candidate's calls were measured with: cupti, events or host
    language: str = "kernel.py"  # the solution's language, or kernel.py for our plain format
    build: dict[str, Any] = field(default_factory=dict)
    # Where the evaluation's time went: (phase, monotonic time it began), in the order marked;
    # the timer's own marks (the candidate's import, rounds, timing) are merged in by the harness.
    marks: list[tuple[str, float]] = field(default_factory=list)
    ceilings: dict[str, Any] = field(
        default_factory=dict
    )  # the calibration T_SOL was computed from

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def mark(self, phase: str, at: float | None = None) -> None:
        """Phase ``phase`` begins at ``at`` (``time.monotonic``, default now) and ends the one before."""
        self.marks.append((phase, time.monotonic() if at is None else at))

    def table(self) -> str:
        """A plain-text table of the rows, for feedback to operators and logs."""
        lines = [
            f"problem {self.problem}: status {self.status}, score {self.score:.4f} {self.message}".rstrip(),
            f"language {self.language}, timer {self.timer or '-'}",
        ]
        if self.published_score is not None:
            lines.append(
                f"published mode: score {self.published_score:.4f} against upstream's times "
                f"(measured on {self.published_hardware or 'unnamed hardware'}; comparable only there)"
            )
        lines.append(
            f"{'workload':<24} {'status':<9} {'T_k ms':>9} {'T_b ms':>9} {'T_SOL ms':>9} {'score':>7}"
        )
        for r in self.rows:
            if r.flops_method and r.flops_method not in ("meta", "sol.json"):
                lines.append(f"note {r.uuid}: FLOPs {r.flops_method}")
            cells = [_fmt(r.kernel_ms), _fmt(r.baseline_ms), _fmt(r.sol_ms), _fmt(r.score, 4)]
            lines.append(
                f"{r.uuid[:24]:<24} {r.status:<9} {cells[0]:>9} {cells[1]:>9} {cells[2]:>9} {cells[3]:>7}  {r.message}".rstrip()
            )
        return "\n".join(lines)

    def roofline(self) -> str:
        """Per workload, where the kernel stands against the roofline: the bound, T_k over T_SOL,
        the achieved bandwidth and matrix FLOP/s as shares of the ceilings, the speed-up over
        the baseline; then the kernels one call launches. Short: it is a prompt's feedback."""
        bandwidth = float(self.ceilings.get("bandwidth_bytes_per_s") or 0)
        rates = self.ceilings.get("matrix_flops_per_s") or {}
        lines = []
        for r in self.rows:
            if r.kernel_ms is None or r.sol_ms is None or not r.kernel_ms > 0:
                continue
            seconds = r.kernel_ms / 1e3
            bound = "compute" if (r.compute_ms or 0) > (r.memory_ms or 0) else "memory"
            parts = [
                f"{r.uuid[:20]} {bound}-bound: T_k {r.kernel_ms:.3g} ms = {r.kernel_ms / r.sol_ms:.2f}x T_SOL"
            ]
            if r.bytes and bandwidth:
                achieved = r.bytes / seconds
                parts.append(f"{achieved / 1e12:.3g} TB/s = {achieved / bandwidth:.0%} of peak")
            for dtype, flops in sorted(r.flops.items()):
                rate = float(rates.get(dtype) or rates.get("bfloat16") or 0)
                if flops and rate:
                    achieved = flops / seconds
                    parts.append(
                        f"{achieved / 1e12:.3g} TFLOP/s {dtype} = {achieved / rate:.0%} of peak"
                    )
            if r.baseline_ms:
                parts.append(f"{r.baseline_ms / r.kernel_ms:.2f}x T_b's speed")
            lines.append("; ".join(parts))
        if lines and self.kernels:
            by_count = sorted(self.kernels.items(), key=lambda kv: -kv[1])
            lines.append(
                "kernels per call: " + ", ".join(f"{name[:32]} x{n}" for name, n in by_count)[:240]
            )
        return "\n".join(lines)


def _fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"
