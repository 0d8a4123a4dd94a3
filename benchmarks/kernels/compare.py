"""Output comparison: raw error statistics (measured anywhere) and the verdict (decided by the harness).

An element passes when ``|out - ref| <= atol + rtol * |ref|`` in fp32; NaN or Inf fails it.
A workload passes when every output has the exact shape and dtype, no NaN/Inf, is not all
zero where the reference is not, has at least ``required_matched_ratio`` of its elements
passing, and (when set) no error above ``max_error_cap`` (SOL-ExecBench ``compute_error_stats``).
With ``allow_negative_inf`` (a workload's tolerance key, as upstream names it), -inf where
the reference also has -inf is a match rather than a non-finite value (masked attention rows).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .spec import Tolerance


def error_stats(out: torch.Tensor, ref: torch.Tensor, tolerance: Tolerance) -> dict[str, Any]:
    """Raw facts about one output against its reference; JSON-serialisable."""
    stats: dict[str, Any] = {
        "shape": list(out.shape),
        "ref_shape": list(ref.shape),
        "dtype": str(out.dtype).removeprefix("torch."),
        "ref_dtype": str(ref.dtype).removeprefix("torch."),
    }
    if out.shape != ref.shape:
        return stats
    x = out.detach().to(torch.float32)
    y = ref.detach().to(device=x.device, dtype=torch.float32)
    both_neg_inf = torch.isneginf(x) & torch.isneginf(y)
    if tolerance.allow_negative_inf:
        x = torch.where(both_neg_inf, torch.zeros_like(x), x)
        y = torch.where(both_neg_inf, torch.zeros_like(y), y)
        stats["negative_inf_matched"] = int(both_neg_inf.sum().item())
    finite = torch.isfinite(x)
    stats["nonfinite"] = int((~finite).sum().item())
    stats["all_zero"] = bool(x.numel() > 0 and bool((x == 0).all().item()))
    stats["ref_all_zero"] = bool(y.numel() > 0 and bool((y == 0).all().item()))
    total = x.numel()
    if total == 0:
        stats.update(matched_ratio=1.0, max_abs=0.0, max_rel=0.0)
        return stats
    err = (x - y).abs()
    bad = (err > tolerance.max_atol + tolerance.max_rtol * y.abs()) | ~torch.isfinite(err)
    stats["matched_ratio"] = 1.0 - float(bad.sum().item()) / total
    finite_err = torch.where(torch.isfinite(err), err, torch.zeros_like(err))
    stats["max_abs"] = float(finite_err.max().item())
    stats["max_rel"] = float(
        (finite_err / y.abs().clamp_min(max(tolerance.max_atol, 1e-12))).max().item()
    )
    return stats


def verdict(stats: Mapping[str, Any], tolerance: Tolerance, *, name: str = "output") -> str | None:
    """None when an output's stats pass; else the reason it fails, in words."""
    if stats["shape"] != stats["ref_shape"]:
        return f"{name}: shape {tuple(stats['shape'])} but the reference has {tuple(stats['ref_shape'])}"
    if stats["dtype"] != stats["ref_dtype"]:
        return f"{name}: dtype {stats['dtype']} but the reference has {stats['ref_dtype']}"
    if stats.get("nonfinite", 0):
        return f"{name}: {stats['nonfinite']} NaN/Inf value(s)"
    if stats.get("all_zero") and not stats.get("ref_all_zero"):
        return f"{name}: all zeros where the reference is not"
    if stats["matched_ratio"] < tolerance.required_matched_ratio:
        return (
            f"{name}: only {stats['matched_ratio']:.4%} of elements within atol={tolerance.max_atol} "
            f"rtol={tolerance.max_rtol} (need {tolerance.required_matched_ratio:.2%}); max abs error {stats['max_abs']:.4g}"
        )
    if tolerance.max_error_cap is not None and stats["max_abs"] > tolerance.max_error_cap:
        return (
            f"{name}: max abs error {stats['max_abs']:.4g} over the cap {tolerance.max_error_cap}"
        )
    return None
