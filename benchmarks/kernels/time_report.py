"""Where a kernel evaluation's time goes, and what its roofline feedback costs (issues 17, 18).

    python -m evolve.benchmarks.kernels.time_report --problem rmsnorm --evaluations 3      # on a GPU
    python -m evolve.benchmarks.kernels.time_report --device cpu --tiny --evaluations 3    # this CPU

Evaluates the problem's seed kernel (our Triton seed where there is one, else the reference)
``--evaluations`` times through ``KernelFitness`` and ``evaluate_safely``, as a search's
worker does (the first evaluation pays calibration and baselines, the later ones reuse
them), and prints each evaluation's ``time_<phase>`` seconds as shares of its ``wall_s``,
the share of the roofline feedback (``time_feedback``; issue 17 allows 3%), and the
feedback text itself. ``--strict`` evaluates 2, 4, ... in the auditor's strict mode and says
what that adds against the normal evaluations beside them. ``--tiny`` caps every axis at 64 (with ``--device cpu``, Triton's
interpreter; times then describe only this harness's overhead).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from .gpu_run import HERE, SEEDS, shrink_dataset


def seed_fitness(problem: str, device: str, tiny: bool, tmp: Path, **settings: str):
    """The fitness of ``problem`` as these reports measure it, and the problem's seed kernel file.

    ``tiny`` caps every axis at 64 (a copy of the suite under ``tmp``); on the CPU (Triton's
    interpreter, which the caller turns on before this import) rounds and calls are few.
    """
    from .fitness import SUITE, KernelFitness

    dataset = shrink_dataset(SUITE, tmp / "tiny") if tiny else SUITE
    cpu = device == "cpu"
    fitness = KernelFitness(problem=problem, dataset=str(dataset), device=device,
                            baseline="eager" if cpu else "compile", quick_calibration=cpu,
                            **({"rounds": 2, "warmup": 2, "iters": 10} if cpu else {}), **settings)  # fmt: skip
    return fitness, HERE / "seeds" / SEEDS.get(problem, "reference") / "kernel.py"


def main(argv: list[str] | None = None) -> int:
    """Evaluate, print the table of phases; exit 1 when an evaluation was not OK."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problem", default="rmsnorm")
    parser.add_argument("--evaluations", type=int, default=3)
    parser.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="cap every axis at 64")
    parser.add_argument(
        "--strict",
        action="store_true",
        help="evaluations 2, 4, ... in the auditor's strict mode, and what that adds against the "
        "normal ones beside them (use --evaluations 6 or more)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a measurement setting of the harness (e.g. batch=5, inputs=fresh); repeatable",
    )
    args = parser.parse_args(argv)
    settings = dict(item.split("=", 1) for item in args.set)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    from evolve.harness.fitness import EvalContext, evaluate_safely

    tmp = Path(tempfile.mkdtemp(prefix="evolve-kernels-time-report-"))
    try:
        fitness, seed = seed_fitness(args.problem, args.device, args.tiny, tmp, **settings)
        rows = []
        for k in range(args.evaluations):
            workdir = tmp / f"candidate-{k}"
            workdir.mkdir()
            shutil.copy(seed, workdir / "kernel.py")
            strict = args.strict and k >= 2 and k % 2 == 0  # evaluation 0 pays the baselines
            ev = evaluate_safely(
                fitness, workdir, EvalContext(seed=k, timeout_s=900.0, strict=strict)
            )
            phases = {
                m.removeprefix("time_"): v for m, v in ev.metrics.items() if m.startswith("time_")
            }
            rows.append((ev, phases, strict))
            print(f"evaluation {k}: {ev.status.value}, fitness {ev.fitness}, wall {ev.wall_s:.3f} s, "
                  f"phases add up to {sum(phases.values()):.3f} s", flush=True)  # fmt: skip
            if not ev.ok:
                print(f"  why: {str(ev.artifacts.get('error', ev.artifacts))[:2000]}", flush=True)
        names = sorted({n for _, phases, _ in rows for n in phases})
        heads = [
            f"eval {k}{' strict' if strict else ''} s (share)"
            for k, (_, _, strict) in enumerate(rows)
        ]
        print("\n| phase | " + " | ".join(heads) + " |")
        print("| --- |" + " ---: |" * len(rows))
        for name in names:
            cells = [
                f"{p.get(name, 0.0):.4f} ({p.get(name, 0.0) / ev.wall_s:.2%})" for ev, p, _ in rows
            ]
            print(f"| {name} | " + " | ".join(cells) + " |")
        print("| wall_s | " + " | ".join(f"{ev.wall_s:.3f}" for ev, _, _ in rows) + " |")
        worst = max(p.get("feedback", 0.0) / ev.wall_s for ev, p, _ in rows)
        print(
            f"\nroofline feedback: at most {worst:.4%} of an evaluation's wall time (allowed: 3%)"
        )
        print("\nfeedback of the last evaluation (artifact 'roofline'):")
        print(rows[-1][0].artifacts.get("roofline", "(none)"))
        extra = [rows[k][0].wall_s - (rows[k - 1][0].wall_s + rows[k + 1][0].wall_s) / 2
                 for k in range(2, len(rows) - 1, 2) if rows[k][2]]  # fmt: skip
        if extra:  # each strict evaluation against the mean of the normal ones beside it
            normal = statistics.fmean(ev.wall_s for ev, _, strict in rows[1:] if not strict)
            print(f"\nstrict mode adds {statistics.fmean(extra):.3f} s to an evaluation: "
                  f"{statistics.fmean(extra) / normal:.1%} of a normal one ({normal:.3f} s)")  # fmt: skip
        return 0 if all(ev.ok for ev, _, _ in rows) else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
