"""Measure the machine's ceilings: memory bandwidth and matrix rates (bf16, fp16, fp8, tf32).

Bandwidth is the larger of a device-to-device copy (bytes read + written) and a full
read (a sum over a large tensor); matrix rates come from square matmuls (``torch._scaled_mm``
for fp8). Each figure is the median of timed runs with the L2 cache flushed before each.
The result is stored as JSON with the benchmark's results, so every score can be traced
to the ceilings it was computed against. Run ``python -m evolve.benchmarks.kernels calibrate``.
"""

from __future__ import annotations

import contextlib
import datetime
import platform
from typing import Any

import torch

from .timing import measure, median


def _median_ms(fn: Any, args: tuple, device: torch.device, iters: int) -> float:
    return median(measure(fn, lambda i: args, device=device, warmup=3, iters=iters))


def device_name(device: torch.device) -> str:
    """A short name of the device (GPU model, or the CPU's architecture)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu-{platform.machine()}"


def calibrate(device: torch.device, *, quick: bool = False) -> dict[str, Any]:
    """Measure bandwidth and matrix rates on ``device``; ``quick`` uses small sizes (CPU, smoke tests)."""
    gpu = device.type == "cuda"
    iters = 5 if quick else 20
    n_bytes = (1 << 30) if gpu and not quick else (64 << 20 if gpu else 16 << 20)
    src = torch.empty(n_bytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    copy_ms = _median_ms(lambda a, b: b.copy_(a), (src, dst), device, iters)
    read_ms = _median_ms(lambda a: a.sum(dtype=torch.float32), (src,), device, iters)
    del dst
    copy_bps = 2 * n_bytes / (copy_ms / 1e3)
    read_bps = n_bytes / (read_ms / 1e3)
    size = 8192 if gpu and not quick else (2048 if gpu else 256)
    rates: dict[str, float] = {}
    flop = 2.0 * size**3
    for key, dtype in (
        ("bfloat16", torch.bfloat16),
        ("float16", torch.float16),
        ("float32", torch.float32),
    ):
        a = torch.randn(size, size, dtype=dtype, device=device)
        b = torch.randn(size, size, dtype=dtype, device=device)
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = (
            True  # the fastest fp32 matmul a candidate could legally use
        )
        try:
            rates[key] = flop / (_median_ms(torch.matmul, (a, b), device, iters) / 1e3)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous
    if gpu:
        with contextlib.suppress(RuntimeError, AttributeError):  # fp8 needs compute capability 8.9+
            a8 = torch.randn(size, size, device=device).to(torch.float8_e4m3fn)
            b8 = torch.randn(size, size, device=device).to(torch.float8_e4m3fn)
            one = torch.ones((), device=device)

            def fp8_mm(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
                return torch._scaled_mm(
                    x, y.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16
                )

            rates["float8"] = flop / (_median_ms(fp8_mm, (a8, b8), device, iters) / 1e3)
    rates.setdefault("float8", rates["bfloat16"])
    return {
        "device": device_name(device),
        "torch": torch.__version__,
        "bandwidth_bytes_per_s": max(copy_bps, read_bps),
        "copy_bytes_per_s": copy_bps,
        "read_bytes_per_s": read_bps,
        "matrix_flops_per_s": rates,
        "sizes": {"bandwidth_bytes": n_bytes, "matmul": size},
        "quick": quick,
        "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
