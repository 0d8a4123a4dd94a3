"""What the harness does to the time it measures: one kernel timed bare and through the harness.

    python -m evolve.benchmarks.kernels.harness_tax --problem rmsnorm       # on a GPU, ~1 min
    python -m evolve.benchmarks.kernels.harness_tax --device cpu --tiny     # CPU check (interpreter)

Per workload, the median time of the problem's seed kernel (``--kernel`` for another file),
measured in one run three ways with the driver's own timer, warm-up, L2 flush and inputs at
shifted addresses:

1. ``bare``: in this process, with nothing else done first;
2. ``after profile``: in this process, after the profiled call the driver makes before it
   times (``guards.kernel_signature``: the torch profiler, then CUPTI in the timing);
3. ``harness``: a full evaluation through ``KernelFitness`` (the sandboxed driver), its
   ``<workload>/kernel_ms``.

and the ratios to ``bare``. The harness should change nothing: on the H200 on 2026-12-01
the rmsnorm seed took 2.1x as long through the harness as bare (kernels/RESULTS.md), and
this table is how to find which step does it. Exit status 1 when the evaluation failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import tempfile
from pathlib import Path

from evolve.benchmarks.kernels.time_report import seed_fitness


def bare_times(fitness, kernel_file: Path, scratch: Path) -> dict[str, tuple[float, float]]:
    """Per workload uuid: (bare ms, ms after a profiled call), medians of the timed calls."""
    import torch
    from evolve.benchmarks.kernels import guards, inputs, pool, timing

    settings, problem = fitness.settings, fitness.problem
    device = torch.device(settings.device)
    reference = inputs.load_reference(problem.definition, scratch)
    spec = importlib.util.spec_from_file_location("harness_tax_kernel", kernel_file)
    assert spec and spec.loader
    kernel = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernel)
    out = {}
    for workload in problem.workloads:
        maker = inputs.InputMaker(problem, workload, device, reference)
        shifted = pool.ShiftedInputs(maker.make(1), settings.warmup + settings.iters)

        def setup(i: int, maker=maker, shifted=shifted) -> list:
            made = shifted.get(settings.warmup + i if i >= 0 else -1 - i)
            return [*made, *maker.allocate()]

        def timed(method: str = settings.timer, setup=setup) -> float:
            with torch.no_grad():
                times = timing.measure(kernel.run, setup, device=device, warmup=settings.warmup,
                                       iters=settings.iters, method=method, flush_l2=settings.flush_l2)  # fmt: skip
            return statistics.median(times)

        plain = timed()
        guards.kernel_signature(kernel.run, [*maker.make(2), *maker.allocate()], device)
        out[workload.uuid] = (plain, timed())
    return out


def measure(problem: str, device: str, tiny: bool, kernel: Path | None = None):
    """(the harness's Evaluation, one row per workload: uuid, bare_ms, profiled_ms, harness_ms)."""
    from evolve.fitness import EvalContext, evaluate_safely

    with tempfile.TemporaryDirectory(prefix="evolve-kernels-harness-tax-") as tmp:
        fitness, seed = seed_fitness(problem, device, tiny, Path(tmp))
        kernel = (kernel or seed).resolve()
        bare = bare_times(fitness, kernel, Path(tmp))
        workdir = Path(tmp) / "candidate"
        workdir.mkdir()
        (workdir / "kernel.py").write_text(kernel.read_text())
        ev = evaluate_safely(fitness, workdir, EvalContext(seed=0, timeout_s=900.0))
    rows = [
        {"uuid": uuid, "bare_ms": plain, "profiled_ms": profiled,
         "harness_ms": ev.metrics.get(f"{uuid}/kernel_ms")}
        for uuid, (plain, profiled) in bare.items()
    ]  # fmt: skip
    return ev, rows


def main(argv: list[str] | None = None) -> int:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )  # fmt: skip
    parser.add_argument("--problem", default="rmsnorm")
    parser.add_argument(
        "--kernel", type=Path, help="a kernel.py to time (default: the problem's seed)"
    )
    parser.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="cap every axis at 64")
    args = parser.parse_args(argv)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    ev, rows = measure(args.problem, args.device, args.tiny, args.kernel)
    print(f"{args.problem}: evaluation {ev.status.value}, score {ev.fitness}")
    if not ev.ok:
        print(f"why: {str(ev.artifacts.get('error', ev.artifacts))[:2000]}")
        return 1
    print("\n| workload | bare ms | after profile ms (x bare) | harness ms (x bare) |")
    print("| --- | ---: | ---: | ---: |")
    for row in rows:
        plain, profiled, harness = row["bare_ms"], row["profiled_ms"], row["harness_ms"]
        cell = f"{harness:.4f} ({harness / plain:.2f}x)" if harness is not None else "-"
        print(
            f"| {row['uuid']} | {plain:.4f} | {profiled:.4f} ({profiled / plain:.2f}x) | {cell} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
