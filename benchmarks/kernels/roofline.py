"""Speed of light per workload: ``T_SOL = max(sum of FLOPs / matrix rate, bytes / bandwidth)``.

FLOPs are counted by running the reference on meta tensors (no data, no device) under a
dispatch mode that applies PyTorch's own FLOP formulas (``torch.utils.flop_counter``) to
each matrix op, keyed by the op's input dtype so that fp8 work meets the fp8 rate. A
problem's ``sol.json`` may instead give the FLOPs as an expression over its axes. Bytes
are the unavoidable traffic: every tensor input read once and every output written once.
Element-wise arithmetic is not counted (it hides under memory traffic on these problems).

A reference that needs values (``nonzero``, ``.item()``, ``bincount``: data-dependent
shapes) cannot run on meta tensors; ``flops_with_fallback`` then counts on one set of real
inputs on the harness's device, and only when that fails too leaves a memory-only bound.
Which of the three happened is returned in words, and ends up in the report's metrics.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from .inputs import InputMaker, torch_dtype
from .spec import Problem, evaluate_expression


def rate_key(dtype: torch.dtype | str) -> str:
    """Which calibrated matrix rate applies to a matmul on ``dtype``."""
    name = str(dtype).removeprefix("torch.")
    if name.startswith("float8"):
        return "float8"
    if name in ("float32", "float64"):
        return "float32"
    if name == "float16":
        return "float16"
    return "bfloat16"


class _FlopCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.flops: dict[str, float] = defaultdict(float)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        if packet in flop_registry:
            tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
            dtype = tensors[0].dtype if tensors else torch.bfloat16
            self.flops[rate_key(dtype)] += float(
                flop_registry[packet](*args, **kwargs, out_val=out)
            )
        return out


def count_flops(problem: Problem, maker: InputMaker, reference: Any) -> dict[str, float]:
    """Matrix FLOPs of one workload by rate key (from ``sol.json`` if present, else counted)."""
    if problem.flops:
        value = float(evaluate_expression(problem.flops, maker.axes))
        first = next(
            (s.dtype for s in problem.definition.inputs.values() if s.shape is not None), "bfloat16"
        )
        return {rate_key(first): value} if value > 0 else {}
    meta = torch.device("meta")
    if maker.workload.custom:
        made = maker.custom({**maker.axes, **maker.workload.scalars()}, meta)  # type: ignore[misc]
        args = [
            made[n] if n in made else maker.workload.scalars()[n] for n in problem.definition.inputs
        ]
    else:
        args = []
        for name, spec in problem.definition.inputs.items():
            shape = problem.definition.shape(spec, maker.axes)
            src = maker.workload.inputs[name]
            if shape is None:
                args.append(
                    src.value if src.kind == "scalar" else (1 if "int" in spec.dtype else 1e-3)
                )
            else:
                args.append(torch.empty(shape, dtype=torch_dtype(spec.dtype), device=meta))
    counter = _FlopCounter()
    with counter, torch.no_grad():
        reference.run(*args)
    return {k: v for k, v in counter.flops.items() if v > 0}


def _count_on_real_inputs(maker: InputMaker, reference: Any) -> dict[str, float]:
    counter = _FlopCounter()
    args = maker.make(0)
    with counter, torch.no_grad():
        reference.run(*args)
    return {k: v for k, v in counter.flops.items() if v > 0}


def flops_with_fallback(
    problem: Problem, maker: InputMaker, reference: Any
) -> tuple[dict[str, float], str]:
    """Matrix FLOPs and how they were found: sol.json, meta tensors, real inputs, or none."""
    if problem.flops:
        return count_flops(problem, maker, reference), "sol.json"
    try:
        return count_flops(problem, maker, reference), "meta"
    except Exception as exc:  # data-dependent ops cannot run without data
        meta_error = f"{type(exc).__name__}: {str(exc)[:200]}"
    try:
        flops = _count_on_real_inputs(maker, reference)
    except Exception as exc:
        return {}, (
            f"none: meta tensors failed ({meta_error}) and real inputs failed "
            f"({type(exc).__name__}: {str(exc)[:200]}); T_SOL is the memory bound only"
        )
    return (
        flops,
        f"real: counted on one set of real inputs on {maker.device} (meta tensors failed: {meta_error})",
    )


def sol_ms(
    bytes_: float, flops: Mapping[str, float], calibration: Mapping[str, Any]
) -> dict[str, float]:
    """The roofline time in ms and its two terms, from measured bandwidth and matrix rates."""
    bandwidth = float(calibration["bandwidth_bytes_per_s"])
    rates = calibration["matrix_flops_per_s"]
    memory_ms = bytes_ / bandwidth * 1e3
    compute_ms = sum(f / float(rates.get(k) or rates["bfloat16"]) * 1e3 for k, f in flops.items())
    return {"sol_ms": max(memory_ms, compute_ms), "memory_ms": memory_ms, "compute_ms": compute_ms}
