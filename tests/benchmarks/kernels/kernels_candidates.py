"""Candidate kernels for the tiny RMSNorm fixture: correct ones, wrong ones, and one per cheat."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from evolve.benchmarks.kernels.harness import Harness, Report, Settings
from evolve.benchmarks.kernels.spec import load_problem

CALIBRATION = {
    "device": "test",
    "bandwidth_bytes_per_s": 1e9,
    "matrix_flops_per_s": {"bfloat16": 1e11},
}
SETTINGS = Settings(
    device="cpu", rounds=2, warmup=1, iters=6, audits=2, baseline="eager", timeout_s=120.0
)

GOOD = """
import torch

def run(x, weight, eps, y):
    xf = x.float()
    y.copy_((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(y.dtype))
"""

IGNORES_WEIGHT = """
import torch

def run(x, weight, eps, y):
    xf = x.float()
    y.copy_((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(y.dtype))
"""

NAN = """
def run(x, weight, eps, y):
    y.fill_(float("nan"))
"""

ZEROS = """
def run(x, weight, eps, y):
    y.zero_()
"""

RAISES = """
def run(x, weight, eps, y):
    raise ValueError("block size too large for this row")
"""

WRONG_SHAPE = """
def run(x, weight, eps, y):
    y.resize_(1)
"""

PATCHED_TIMER = (
    """
import torch
torch.cuda.Event.elapsed_time = lambda self, end: 1e-6
"""
    + GOOD
)

PATCHED_CLOCK_AT_CALL = """
import time
import torch

def run(x, weight, eps, y):
    time.perf_counter_ns = lambda: 0
    xf = x.float()
    y.copy_((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(y.dtype))
"""

EXTRA_THREAD = """
import threading
import time
import torch

def run(x, weight, eps, y):
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
    xf = x.float()
    y.copy_((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(y.dtype))
"""

PROXY_OUTPUT = """
import torch

def run(x, weight, eps, y):
    xf = x.float()
    y.set_((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(y.dtype))
"""

CACHED_OUTPUT = """
import torch

calls = [0]
cache = {}

def run(x, weight, eps, y):
    calls[0] += 1
    if calls[0] <= 2:  # the correctness rounds: compute, and keep the answer
        xf = x.float()
        y.copy_((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(y.dtype))
        cache["y"] = y.clone()
    else:  # afterwards: replay the cached answer (cheap)
        y.copy_(cache["y"])
"""

INLINE_CPP = (
    """
import torch.utils.cpp_extension as ce

try:
    ce.load_inline(name="fast", cpp_sources="int f() { return 1; }", functions=["f"])
except Exception:
    pass
"""
    + GOOD
)

KERNEL_SWITCH = """
import torch

calls = [0]

def run(x, weight, eps, y):
    calls[0] += 1
    xf = x.float()
    var = xf.pow(2).mean(-1, keepdim=True)
    if calls[0] <= 4:
        normed = xf * torch.rsqrt(var + eps)
    else:  # same values through other ops once timing has started
        normed = torch.div(xf, torch.sqrt(var + eps))
    y.copy_((normed * weight.float()).to(y.dtype))
"""

DISPATCH_MODE = (
    """
from torch.utils._python_dispatch import TorchDispatchMode

class Spy(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))

Spy().__enter__()
"""
    + GOOD
)

LEFTOVER_PROCESS = (
    """
import subprocess
subprocess.Popen(["sleep", "60"])
"""
    + GOOD
)

TAMPERED_DRIVER = """
import torch
from evolve.benchmarks.kernels import compare, guards, timer

# Disable, in this process, every check the harness has and make every comparison a perfect match.
guards.CppBlocker.check = lambda self, when: None
timer.Measurer.failure = lambda self, stats: None


def perfect(out, ref, tolerance):
    return {"shape": list(out.shape), "ref_shape": list(ref.shape), "dtype": str(out.dtype).removeprefix("torch."),
            "ref_dtype": str(ref.dtype).removeprefix("torch."), "nonfinite": 0, "all_zero": False,
            "ref_all_zero": False, "matched_ratio": 1.0, "max_abs": 0.0, "max_rel": 0.0}


compare.error_stats = perfect


def run(x, weight, eps, y):
    y.zero_()  # no work at all
"""


def evaluate(dataset: Path, code: str, workdir: Path, *, settings: Settings = SETTINGS) -> Report:
    """Score ``code`` as kernel.py on the fixture problem in ``dataset`` (Triton interpreter on)."""
    problem = load_problem(dataset / "tiny_rmsnorm")
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "kernel.py").write_text(code)
    return Harness(problem, settings, calibration=CALIBRATION).evaluate(
        workdir, env={"TRITON_INTERPRET": "1"}
    )


def evaluate_many(
    dataset: Path, codes: dict[str, str], root: Path, *, workers: int = 3
) -> dict[str, Report]:
    """Score several candidates at once (separate sandboxed processes, a few in parallel)."""
    from concurrent.futures import ThreadPoolExecutor

    problem = load_problem(dataset / "tiny_rmsnorm")
    Harness(problem, SETTINGS, calibration=CALIBRATION).baselines(
        {"TRITON_INTERPRET": "1"}
    )  # measure once, shared
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {
            name: pool.submit(evaluate, dataset, code, root / f"cand{i}")
            for i, (name, code) in enumerate(codes.items())
        }
        return {name: future.result() for name, future in futures.items()}


def needs_triton() -> None:
    """Skip when Triton is not installed (it is the [gpu] extra)."""
    pytest.importorskip("triton", reason="Triton is not installed: pip install 'evolve[gpu]'")
    os.environ.setdefault("TRITON_INTERPRET", "1")
