"""Upstream's published per-workload times, where a dataset carries them (``score_mode=published``).

Upstream's leaderboard publishes, per workload, the baseline time T_b and the SOL time
T_SOL measured/derived on its hardware (B200). A dataset carries them either in
``published.json`` beside ``definition.json`` or as a ``published`` object per workload line.
"""

from __future__ import annotations

import json
from pathlib import Path


def load_published(root: Path, wl_path: Path) -> tuple[dict[str, dict[str, float]], str]:
    """Published baseline and SOL times per workload: ``published.json`` beside the problem
    (``{"hardware": "B200", "workloads": {uuid: {"baseline_ms": ..., "sol_ms": ...}}}``), or a
    ``published`` object on a workload line (``{"baseline_ms", "sol_ms", "hardware"}``)."""
    found: dict[str, dict[str, float]] = {}
    hardware = ""
    if (root / "published.json").is_file():
        data = json.loads((root / "published.json").read_text())
        hardware = str(data.get("hardware") or "")
        for uuid, times in (data.get("workloads") or {}).items():
            found[str(uuid)] = {
                "baseline_ms": float(times["baseline_ms"]),
                "sol_ms": float(times["sol_ms"]),
            }
    for line in wl_path.read_text().splitlines():
        record = json.loads(line) if line.strip() else {}
        record = record.get("workload", record) if "uuid" not in record else record
        times = record.get("published")
        if times:
            found[str(record["uuid"])] = {
                "baseline_ms": float(times["baseline_ms"]),
                "sol_ms": float(times["sol_ms"]),
            }
            hardware = hardware or str(times.get("hardware") or "")
    return found, hardware
