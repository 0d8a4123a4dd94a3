"""The profile summary of a few steps: real torch.profiler events, shares by the outermost op, bounded reports."""

from __future__ import annotations

import json

import torch
from torch.profiler import record_function

from evolve.harness import profiling


def profiled(work) -> dict:
    profiler = profiling.StepProfiler(first=0, count=1)
    profiler.after_step(0, 0)  # the profile starts once step `first` ended
    work()
    profiler.after_step(1, 4096)
    return profiler.report()


def test_a_matrix_product_inside_the_optimizer_step_counts_as_optimizer():
    a = torch.randn(256, 256)

    def step():
        for _ in range(8):
            a @ a  # a plain matrix product
        with record_function("Optimizer.step#Test.step"):
            for _ in range(8):
                a @ a  # the optimizer's (as in Muon's Newton-Schulz iterations)

    summary = profiled(step)
    shares = summary["shares"]
    # both classes present (shares of wall time depend on the machine's load: no margins)
    assert shares["matmul"] > 0 and shares["optimizer"] > 0
    assert summary["steps"] == 1 and summary["tokens_per_s"] > 0 and summary["tflops"] > 0
    assert summary["top"][0][0] == "aten::mm" and summary["device"] == "cpu"
    text = profiling.describe(profiling.sanitize(json.dumps(summary)))
    assert text.endswith("MFU n/a") and "share of wall time: " in text


def test_a_report_from_the_training_process_is_cut_to_known_bounded_fields():
    raw = {"steps": 3, "seconds": 1.5, "evil": "x" * 10_000, "top": [["a" * 500, 0.1]] * 50}
    clean = profiling.sanitize(json.dumps(raw))
    assert "evil" not in clean and len(clean["top"]) == profiling.MAX_OPS
    assert len(clean["top"][0][0]) == profiling.MAX_NAME
    assert profiling.sanitize("not json") is None and profiling.sanitize('{"steps": "x"}') is None
    assert profiling.requested({profiling.PROFILE_ENV: "12 3"}) == (12, 3)
    assert profiling.requested({}) is None
