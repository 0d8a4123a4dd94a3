"""Timed calls' inputs as upstream makes them: the same values, at a new address every call.

SOL-ExecBench (``ShiftingMemoryPoolAllocator`` in ``sol_execbench/core/bench/io.py``) keeps
one set of inputs per workload and, before each timed call, copies each tensor into a
pool at an offset 256 bytes further on, so that every call sees the same values at a
different ``data_ptr`` (a kernel cannot key a cache on the pointer) while memory stays
near one copy of the inputs. This class does the same for one set of inputs; Python
scalars pass through unchanged. Strides (including the zero strides of an ``expand``)
are kept, so the pool holds only the storage a tensor really spans.

Two more placements catch caches the shifting pool does not: ``RecurringAddresses`` puts
fresh values at addresses already used (a cache keyed on the pointer goes stale), and
``perturb_rows`` changes a random half of the rows of a call's inputs while the other half
keeps the values seen before (a cache keyed on a sample of the values goes stale when the
sample falls in the unchanged half; the complementary mask covers the other case).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

ALIGNMENT_BYTES = 256
PERTURBED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class ShiftedInputs:
    """``get(i)`` returns the inputs copied to the i-th shifted position (0 <= i < calls)."""

    def __init__(self, inputs: Sequence[Any], calls: int):
        self.calls = calls
        self.entries: list[dict[str, Any]] = []
        for value in inputs:
            if not isinstance(value, torch.Tensor):
                self.entries.append({"scalar": value})
                continue
            if any(s < 0 for s in value.stride()):
                value = value.contiguous()
            span = _span(value)
            step = max(1, ALIGNMENT_BYTES // value.element_size())
            pool = torch.empty(span + (calls - 1) * step, dtype=value.dtype, device=value.device)
            source = value.as_strided((span,), (1,)).clone()
            self.entries.append({"pool": pool, "source": source, "span": span, "step": step,
                                 "shape": tuple(value.shape), "strides": tuple(value.stride())})  # fmt: skip

    def get(self, index: int) -> list[Any]:
        """The inputs at position ``index``: a fresh copy of the values at a new address."""
        if not 0 <= index < self.calls:
            raise IndexError(f"shifted inputs hold {self.calls} positions, asked for {index}")
        out: list[Any] = []
        for entry in self.entries:
            if "scalar" in entry:
                out.append(entry["scalar"])
                continue
            start = index * entry["step"]
            entry["pool"].narrow(0, start, entry["span"]).copy_(entry["source"])
            out.append(entry["pool"].as_strided(entry["shape"], entry["strides"], start))
        return out


def _span(tensor: torch.Tensor) -> int:
    """Storage elements a tensor spans (its numel when contiguous, less when broadcast)."""
    if tensor.numel() == 0:
        return 0
    return 1 + sum(
        (size - 1) * stride
        for size, stride in zip(tensor.shape, tensor.stride(), strict=True)
        if size > 1
    )


class RecurringAddresses:
    """Fresh values at addresses that recur: every ``place`` copies new inputs into one fixed set
    of buffers, so a result cached on an input's ``data_ptr`` is stale at the next call."""

    def __init__(self) -> None:
        self.buffers: list[Any] = []

    def place(self, inputs: Sequence[Any]) -> list[Any]:
        """``inputs`` copied into the buffers (made on the first call); Python scalars unchanged."""
        if not self.buffers:
            self.buffers = [
                torch.empty_like(v) if isinstance(v, torch.Tensor) and v.is_contiguous() else None
                for v in inputs
            ]
        placed = []
        for buffer, value in zip(self.buffers, inputs, strict=True):
            if buffer is None or buffer.shape != getattr(value, "shape", None):
                placed.append(value)  # a scalar, a broadcast view, a changed shape: passed as it is
                continue
            placed.append(buffer.copy_(value))
        return placed


def perturb_rows(inputs: Sequence[Any], fresh: Sequence[Any], masks: Sequence[Any]) -> None:
    """Replace, in place, the rows (along dim 0) of each floating-point input chosen by its mask
    with the same rows of ``fresh``; a mask is None where an input is left as it is."""
    for value, new, mask in zip(inputs, fresh, masks, strict=True):
        if mask is not None:
            value[mask] = new[mask]


def row_masks(inputs: Sequence[Any], generator: torch.Generator) -> list[Any]:
    """Per input: a boolean mask choosing half of its rows at random (None for scalars, integer
    and fp8/fp4 tensors, whose values may be indices or packed, and tensors of fewer than two rows)."""
    masks = []
    for value in inputs:
        if not (isinstance(value, torch.Tensor) and value.dtype in PERTURBED_DTYPES and value.dim() >= 1
                and value.shape[0] >= 2):  # fmt: skip
            masks.append(None)
            continue
        rows = value.shape[0]
        mask = torch.zeros(rows, dtype=torch.bool)
        mask[torch.randperm(rows, generator=generator)[: rows // 2]] = True
        masks.append(mask.to(value.device))
    return masks
