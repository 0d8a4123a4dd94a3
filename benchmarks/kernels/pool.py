"""Timed calls' inputs as upstream makes them: the same values, at a new address every call.

SOL-ExecBench (``ShiftingMemoryPoolAllocator`` in ``sol_execbench/core/bench/io.py``) keeps
one set of inputs per workload and, before each timed call, copies each tensor into a
pool at an offset 256 bytes further on, so that every call sees the same values at a
different ``data_ptr`` (a kernel cannot key a cache on the pointer) while memory stays
near one copy of the inputs. This class does the same for one set of inputs; Python
scalars pass through unchanged. Strides (including the zero strides of an ``expand``)
are kept, so the pool holds only the storage a tensor really spans.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

ALIGNMENT_BYTES = 256


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
