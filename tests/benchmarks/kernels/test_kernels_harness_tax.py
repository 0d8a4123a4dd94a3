"""The harness measures a kernel as it runs bare: harness_tax on the CPU (the path) and on a GPU (the ratio)."""

from __future__ import annotations

import pytest
import torch
from evolve.benchmarks.kernels.harness_tax import measure


def test_harness_tax_times_every_workload_three_ways_on_the_cpu(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    ev, rows = measure("rmsnorm", "cpu", tiny=True)
    assert ev.ok, dict(ev.artifacts)
    assert len(rows) == 4
    for row in rows:
        assert row["bare_ms"] > 0 and row["profiled_ms"] > 0 and row["harness_ms"] > 0, row


@pytest.mark.gpu
def test_on_a_gpu_the_harness_times_the_seed_kernel_as_bare():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    ev, rows = measure("rmsnorm", "cuda", tiny=False)
    assert ev.ok, dict(ev.artifacts)
    for row in rows:  # the same kernel, timer and inputs: the sandboxed driver adds nothing
        assert row["harness_ms"] < 1.25 * row["bare_ms"], rows
