"""GPU clock sampling for speed comparisons: readings parsed, busy samples summarised, the sampler ended."""

from __future__ import annotations

import os
import time
from pathlib import Path

from evolve.benchmarks import gpu_clocks

FAKE_SMI = """#!/bin/sh
echo "$@" > {args}
echo $$ > {pid}
echo "100, 1980, 650.5, 60"
echo "95, 1900, 640.5, 62"
echo "10, 345, 90.0, 40"
echo "[N/A], 1980, 600.0, 50"
exec sleep 60
"""


def test_a_line_parses_into_a_reading_and_anything_else_into_none():
    assert gpu_clocks.parse("97, 1755, 612.3, 58\n") == gpu_clocks.Reading(97, 1755, 612.3, 58)
    assert gpu_clocks.parse("[N/A], 1755, 612.3, 58") is None
    assert gpu_clocks.parse("Field 'clocks.sm' is not a valid field to query.") is None


def test_the_sampler_summarises_the_busy_samples_and_ends_nvidia_smi(tmp_path, monkeypatch):
    args, pid = tmp_path / "args", tmp_path / "pid"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(args=args, pid=pid))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    with gpu_clocks.sampled("1") as samples:
        deadline = time.monotonic() + 30
        while (len(samples.readings) < 3 or not samples.error) and time.monotonic() < deadline:
            time.sleep(0.05)
    summary = samples.summary()
    assert summary == {
        "samples": 3,
        "busy_samples": 2,
        "sm_mhz_median": 1940.0,
        "sm_mhz_min": 1900.0,
        "power_w_mean": 645.5,
        "temperature_c_max": 62.0,
    }
    assert "-i 5" in args.read_text()  # the GPU as nvidia-smi numbers it, not this process's index
    assert "[N/A]" in samples.error
    assert not Path(f"/proc/{pid.read_text().strip()}").exists()  # the sampler ended with the block
    assert (
        gpu_clocks.describe(summary) == "SM clock median 1940 MHz (lowest 1900), 646 W, up to 62 C"
    )


def test_without_a_gpu_or_nvidia_smi_the_summary_says_why(tmp_path, monkeypatch):
    with gpu_clocks.sampled(None) as samples:
        pass
    assert gpu_clocks.describe(samples.summary()) == "clocks not sampled (no GPU)"
    monkeypatch.setenv("PATH", str(tmp_path))
    with gpu_clocks.sampled("0") as samples:
        pass
    assert samples.summary()["error"] == "nvidia-smi not found"
