"""Score the seed of a CPU-scale benchmark a few times through its real fitness (before/after figures).

Each run is one full evaluation of the benchmark's seed, as the search's workers do it, with
the benchmark's default settings (``python -m evolve benchmark=NAME``). It prints one line a
run (the score and what it depends on) and the load average before and after, since on a
shared CPU the number of steps that fit in the budget follows the load::

    python scripts/cpu_seed_scores.py nanochat --runs 3
    python scripts/cpu_seed_scores.py speedrun_cpu --runs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from evolve.backends.base import run_job
from evolve.config import build_benchmark, compose
from evolve.types import Job

SHOWN = {  # metrics worth a column, per benchmark
    "nanochat": ("steps", "tokens_per_s", "stop_to_save_s", "step_to_save_s", "save_allowed_s"),
    "speedrun_cpu": ("loss_mean", "loss_std", "pvalue", "time_mean_s", "target"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("benchmark", choices=sorted(SHOWN))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0, help="the first run's seed (then +1...)")
    args = parser.parse_args()
    benchmark = build_benchmark(compose([f"benchmark={args.benchmark}"])["benchmark"])
    files = benchmark.seed_files()
    print(f"load average before: {os.getloadavg()}")
    scores = []
    for run in range(args.runs):
        began = time.monotonic()
        job = Job(candidate_id=f"seed-{run}", files=files, seed=args.seed + run,
                  timeout_s=benchmark.timeout_s)  # fmt: skip
        ev = run_job(benchmark.fitness, job, None)
        shown = {k: ev.metrics[k] for k in SHOWN[args.benchmark] if k in ev.metrics}
        print(f"run {run} (seed {args.seed + run}): {ev.status.value} fitness {ev.fitness} "
              f"{shown} wall {time.monotonic() - began:.1f}s "
              f"{ev.artifacts.get('error', '')}".rstrip(), flush=True)  # fmt: skip
        if ev.ok:
            scores.append(ev.fitness)
    if scores:
        spread = statistics.stdev(scores) if len(scores) > 1 else 0.0
        print(f"{args.benchmark} seed: mean {statistics.fmean(scores):.4f} sd {spread:.4f} "
              f"over {len(scores)} OK run(s) of {args.runs}")  # fmt: skip
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
