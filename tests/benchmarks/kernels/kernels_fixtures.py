"""Tiny problems in the SOL-ExecBench layout, small enough for the CPU and Triton's interpreter."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

RMSNORM_REFERENCE = textwrap.dedent(
    """
    import torch

    def run(x, weight, eps):
        xf = x.to(torch.float32)
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return (y * weight.to(torch.float32)).to(x.dtype)
    """
).strip()


def write_problem(
    root: Path, definition: dict, workloads: list[dict], sol: dict | None = None
) -> Path:
    """Write one problem folder and return it."""
    folder = root / definition["name"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "definition.json").write_text(json.dumps(definition, indent=2))
    (folder / "workload.jsonl").write_text("\n".join(json.dumps(w) for w in workloads) + "\n")
    if sol:
        (folder / "sol.json").write_text(json.dumps(sol))
    return folder


def tiny_rmsnorm(root: Path, name: str = "tiny_rmsnorm", rows: tuple[int, ...] = (8, 33)) -> Path:
    """An RMSNorm problem with H=64 (const), T varying, eps as a scalar input."""
    definition = {
        "name": name,
        "op_type": "norm",
        "axes": {"T": {"type": "var"}, "H": {"type": "const", "value": 64}},
        "inputs": {
            "x": {"shape": ["T", "H"], "dtype": "bfloat16"},
            "weight": {"shape": ["H"], "dtype": "bfloat16"},
            "eps": {"shape": None, "dtype": "float32"},
        },
        "outputs": {"y": {"shape": ["T", "H"], "dtype": "bfloat16"}},
        "reference": RMSNORM_REFERENCE,
    }
    workloads = [
        {
            "uuid": f"t{t}",
            "axes": {"T": t},
            "inputs": {
                "x": {"type": "random"},
                "weight": {"type": "random"},
                "eps": {"type": "scalar", "value": 1e-6},
            },
        }
        for t in rows
    ]
    return write_problem(root, definition, workloads)
