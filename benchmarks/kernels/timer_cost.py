"""What timing a call from another process costs: the same near-empty call timed in-process and by the timer.

``python -m evolve.benchmarks.kernels.timer_cost [--device cpu|cuda] [--calls N]`` times a
kernel that copies a small tensor (``y.copy_(x)``, 64x64 bf16) three ways in one run:
in the process that calls it (host clock around each call, as the driver did before the
timer existed; on a GPU with a device synchronisation after the call), and through the timer
and the candidate's process (``timer.Session``) with batches of 1 and of 10 calls. The
difference per call is what the design adds to every timing (and to the baselines alike).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

COPY = "def run(x, y):\n    y.copy_(x)\n"
DEFINITION = {"name": "copy", "axes": {"N": {"type": "const", "value": 64}},
              "inputs": {"x": {"shape": ["N", "N"], "dtype": "bfloat16"}},
              "outputs": {"y": {"shape": ["N", "N"], "dtype": "bfloat16"}},
              "reference": "def run(x):\n    return x.clone()\n"}  # fmt: skip


def in_process(device: str, calls: int) -> float:
    """Median milliseconds of ``calls`` calls timed around each call in this process."""
    import torch

    dev = torch.device(device)
    x = torch.randn(64, 64, dtype=torch.bfloat16, device=dev)
    times = []
    for _ in range(calls):
        y = torch.empty_like(x)
        start = time.perf_counter_ns()
        y.copy_(x)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append((time.perf_counter_ns() - start) / 1e6)
    return statistics.median(times)


def through_timer(device: str, calls: int, batch: int, root: Path) -> float:
    """Median per-call milliseconds of the batches the timer measured (``batch`` calls a batch)."""
    from . import inputs, spec, timer

    problem = spec.load_problem(root / "copy")
    reference = inputs.load_reference(problem.definition, root / "harness")
    session = timer.Session(device, cwd=root / "work")
    try:
        session.ask({"op": "load", "entry": {"file": "kernel.py", "function": "run", "dps": True}, "env": {},
                     "outputs": ["y"], "problem_dir": str(problem.root), "harness_dir": str(root / "harness")})  # fmt: skip
        job = {"device": device, "seed": 1, "warmup": batch, "iters": calls, "batch": batch, "audits": 0}
        times = timer.time_reference(session, job, problem, problem.workloads[0], reference)[0]
    finally:
        session.close()
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    """Print the three medians and the overhead per call."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="evolve-kernels-timer-cost-") as tmp:
        root = Path(tmp)
        for name in ("copy/", "work/", "harness/"):
            (root / name).mkdir()
        (root / "copy" / "definition.json").write_text(json.dumps(DEFINITION))
        (root / "copy" / "workload.jsonl").write_text(json.dumps({"uuid": "n64", "axes": {}, "inputs": {"x": {"type": "random"}}}) + "\n")
        (root / "work" / "kernel.py").write_text(COPY)
        os.environ.setdefault("TRITON_INTERPRET", "1")
        before = in_process(args.device, args.calls)
        rows = {"in-process (before)": before}
        for batch in (1, 10):
            rows[f"timer, batches of {batch}"] = through_timer(args.device, args.calls, batch, root)
    for name, value in rows.items():
        print(f"{name:<24} {value * 1000:9.1f} us/call   (+{(value - before) * 1000:.1f} us)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
