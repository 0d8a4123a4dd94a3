"""What the harness does to the time it measures: one kernel timed bare and through the harness.

    python -m evolve.benchmarks.kernels.harness_tax --problem rmsnorm       # on a GPU, ~1 min
    python -m evolve.benchmarks.kernels.harness_tax --device cpu --tiny     # CPU check (interpreter)

Per workload, the median time of the problem's seed kernel (``--kernel`` for another file),
measured in one run four ways, with warm-up, L2 flush and inputs at shifted addresses:

1. ``bare``: in this process, each call timed alone (CUPTI or CUDA events on a GPU, the
   host clock on a CPU: ``timing.measure``), with nothing else done first;
2. ``after profile``: the same, after a profiled call (``guards.kernel_signature``: the torch
   profiler, then CUPTI in the timing);
3. ``timer``: the harness's timer process (``timer.py``) with the harness's job, run without
   the sandbox: batches of calls in the candidate's process, timed on the timer's clock
   from the message that hands the batch over to its outputs being read;
4. ``harness``: a full evaluation through ``KernelFitness`` (the sandboxed timer), its
   ``<workload>/kernel_ms``.

and the ratios to ``bare``: ``timer`` over ``bare`` is what timing from another process adds
(the hand-over, the views of the arena, the launches); ``harness`` over ``timer`` is what the
sandbox adds, which should be nothing. On the H200 on 2026-12-01
this table found that the rmsnorm seed ran 2.1x as long after the profiled call as bare
(and so in the driver and through the harness): the torch profiler left CUPTI state that
slowed the next CUPTI timing window, which now starts from a detached CUPTI
(``timing._measure_cupti``; kernels/RESULTS.md). Exit status 1 when the evaluation failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .time_report import seed_fitness


def bare_times(fitness, kernel_file: Path, scratch: Path) -> dict[str, tuple[float, float]]:
    """Per workload uuid: (bare ms, ms after a profiled call), medians of the timed calls."""
    import torch

    from . import guards, inputs, pool, timing

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


def unsandboxed_timer_times(fitness, workdir: Path, scratch: Path) -> dict[str, float]:
    """Per workload uuid: the median time the harness's timer measures when run without the sandbox."""
    from evolve.harness.protocol import SAFE_PATH, job_input

    from .harness import Harness
    from .process import TIMER

    harness = Harness(fitness.problem, fitness.settings, calibration=fitness.calibration)
    (scratch / "harness").mkdir()
    entry = {"file": "kernel.py", "function": "run", "dps": True}
    nonce, stdin = job_input(harness.timer_job(fitness.settings, entry, {}, harness_dir=scratch / "harness"))
    done = subprocess.run([sys.executable, *SAFE_PATH, "-m", TIMER, fitness.settings.device], cwd=workdir,
                          input=stdin, capture_output=True, timeout=900)  # fmt: skip
    lines = [json.loads(line) for line in done.stdout.decode().splitlines() if line.startswith("{")]
    raw = next((line for line in lines if line.get("nonce") == nonce), {})
    if "workloads" not in raw:
        raise RuntimeError(f"the timer gave no result: {raw or done.stderr.decode()[-2000:]}")
    return {
        w["uuid"]: statistics.median(w["timings_ms"][0])
        for w in raw["workloads"]
        if w.get("timings_ms")
    }


def measure(problem: str, device: str, tiny: bool, kernel: Path | None = None):
    """(the harness's Evaluation, one row per workload: uuid, bare_ms, profiled_ms, timer_ms, harness_ms)."""
    from evolve.harness.fitness import EvalContext, evaluate_safely

    with tempfile.TemporaryDirectory(prefix="evolve-kernels-harness-tax-") as tmp:
        fitness, seed = seed_fitness(problem, device, tiny, Path(tmp))
        kernel = (kernel or seed).resolve()
        bare = bare_times(fitness, kernel, Path(tmp))
        workdir = Path(tmp) / "candidate"
        workdir.mkdir()
        (workdir / "kernel.py").write_text(kernel.read_text())
        timer = unsandboxed_timer_times(fitness, workdir, Path(tmp))
        ev = evaluate_safely(fitness, workdir, EvalContext(seed=0, timeout_s=900.0))
    rows = [
        {"uuid": uuid, "bare_ms": plain, "profiled_ms": profiled, "timer_ms": timer.get(uuid),
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
    print(
        "\n| workload | bare ms | after profile ms (x bare) | timer, no sandbox, ms (x bare) "
        "| harness ms (x bare) |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    for row in rows:
        plain = row["bare_ms"]
        cells = [
            f"{row[key]:.4f} ({row[key] / plain:.2f}x)" if row[key] is not None else "-"
            for key in ("profiled_ms", "timer_ms", "harness_ms")
        ]
        print(f"| {row['uuid']} | {plain:.4f} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
