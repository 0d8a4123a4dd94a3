"""The harness measures a kernel as it runs bare: harness_tax on the CPU (the path) and on a GPU (the ratio)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from evolve.benchmarks.kernels.harness_tax import measure


def test_harness_tax_times_every_workload_three_ways_on_the_cpu():
    # a process of its own: Triton's interpreter keeps state that other tests' kernels share
    done = subprocess.run(
        [sys.executable, "-m", "evolve.benchmarks.kernels.harness_tax", "--device", "cpu", "--tiny"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| rmsnorm_")]
    assert len(rows) == 4, done.stdout
    for row in rows:  # | workload | bare ms | after profile ms | timer ms | harness ms |
        cells = [cell.split()[0] for cell in row.strip("|").split("|")[1:]]
        assert all(float(cell) > 0 for cell in cells), row


@pytest.mark.gpu
def test_on_a_gpu_the_harness_times_the_seed_kernel_as_bare():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    ev, rows = measure("rmsnorm", "cuda", tiny=False)
    assert ev.ok, dict(ev.artifacts)
    print(rows)  # timer_ms / bare_ms: what timing from another process adds on this GPU
    for row in rows:  # a profile before adds nothing (it left CUPTI slowing the next window 2.1x),
        # nor does the sandbox around the timer
        assert row["profiled_ms"] < 1.25 * row["bare_ms"], rows
        assert row["harness_ms"] < 1.25 * row["timer_ms"], rows
