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
    # the products lead on a quiet machine; under load the range's own time (the gaps between
    # its products, when the process waits for a core) can outgrow them, so no rank is asserted
    assert "aten::mm" in dict(summary["top"]) and summary["device"] == "cpu"
    text = profiling.describe(profiling.sanitize(json.dumps(summary)))
    assert text.endswith("MFU n/a") and "share of wall time: " in text


class GpuEvent:
    """What ``summarize`` reads of one kineto event, for a GPU timeline this machine cannot record."""

    def __init__(self, name, device, start_us, end_us, corr=0, linked=0, annotation=False):
        self._name, self._device, self._annotation = name, device, annotation
        self._start, self._end, self._corr, self._linked = start_us * 1000, end_us * 1000, corr, linked

    def name(self):
        return self._name

    def device_type(self):
        return self._device

    def is_user_annotation(self):
        return self._annotation

    def linked_correlation_id(self):
        return self._linked

    def correlation_id(self):
        return self._corr

    def is_async(self):
        return False

    def start_thread_id(self):
        return 1

    def start_ns(self):
        return self._start

    def end_ns(self):
        return self._end

    def duration_ns(self):
        return self._end - self._start

    def flops(self):
        return 0


def test_gpu_user_annotations_are_ranges_not_kernels():
    from torch.autograd import DeviceType

    cpu, gpu = DeviceType.CPU, DeviceType.CUDA
    events = [
        GpuEvent("aten::mm", cpu, 0, 10, corr=7),
        GpuEvent("sm90_gemm", gpu, 20, 420, linked=7),  # 400 us of matmul
        GpuEvent("flash_fwd", gpu, 420, 620, linked=99),  # launched by compiled code: no op
        # the compiled graph's call and the optimizer's range as seen on the GPU: they span kernels
        GpuEvent("## Call CompiledFxGraph abc ##", gpu, 0, 10**9, annotation=True),
        GpuEvent("Optimizer.step#AdamW.step", gpu, 20, 620, linked=7, annotation=True),
    ]
    summary = profiling.summarize(events, wall_s=0.001, steps=1, tokens=1, cuda=True)
    assert [name for name, _ in summary["top"]] == ["sm90_gemm", "flash_fwd"]
    assert abs(summary["shares"]["matmul"] - 0.4) < 1e-9
    assert abs(summary["shares"]["attention"] - 0.2) < 1e-9
    assert abs(summary["shares"]["idle"] - 0.4) < 1e-9 and summary["shares"]["optimizer"] == 0


def test_a_report_from_the_training_process_is_cut_to_known_bounded_fields():
    raw = {"steps": 3, "seconds": 1.5, "evil": "x" * 10_000, "top": [["a" * 500, 0.1]] * 50}
    clean = profiling.sanitize(json.dumps(raw))
    assert "evil" not in clean and len(clean["top"]) == profiling.MAX_OPS
    assert len(clean["top"][0][0]) == profiling.MAX_NAME
    assert profiling.sanitize("not json") is None and profiling.sanitize('{"steps": "x"}') is None
    assert profiling.requested({profiling.PROFILE_ENV: "12 3"}) == (12, 3)
    assert profiling.requested({}) is None
