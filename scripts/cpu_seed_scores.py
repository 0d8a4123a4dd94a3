"""Score the seed of a CPU-scale benchmark a few times through its real fitness (before/after figures).

Each run is one full evaluation of the benchmark's seed, as the search's workers do it, with
the benchmark's default settings (``python -m evolve benchmark=NAME``). It prints one line a
run (the score and what it depends on) and the load average before and after, since on a
shared CPU the number of steps that fit in the budget follows the load; for speedrun, also
how often the seed passes its target, simulated from the per-seed losses::

    python scripts/cpu_seed_scores.py nanochat --runs 3
    python scripts/cpu_seed_scores.py speedrun_cpu --runs 3
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import time

import numpy as np
from scipy import stats

from evolve.backends.base import run_job
from evolve.launch.config import build_benchmark, compose
from evolve.types import Job

SHOWN = {  # metrics worth a column, per benchmark
    "nanochat": ("steps", "tokens_per_s", "stop_to_save_s", "save_allowed_s"),
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
    scores, losses = [], []
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
        losses += [v for k, v in ev.metrics.items() if re.fullmatch(r"loss_\d+", k)]
    if scores:
        spread = statistics.stdev(scores) if len(scores) > 1 else 0.0
        print(f"{args.benchmark} seed: mean {statistics.fmean(scores):.4f} sd {spread:.4f} "
              f"over {len(scores)} OK run(s) of {args.runs}")  # fmt: skip
    if losses:
        print(pass_rate(losses, benchmark.fitness))
    print(f"load average after: {os.getloadavg()}")


def pass_rate(losses: list[float], fitness) -> str:
    """speedrun: how often a seed with these losses' mean and spread passes its target's t-test
    (simulated evaluations of ``n_seeds`` seeds each)."""
    mean, sd, n = statistics.fmean(losses), statistics.stdev(losses), fitness.n_seeds
    draws = np.random.default_rng(0).normal(mean, sd, size=(100_000, n))
    t = (draws.mean(axis=1) - fitness.target) / (draws.std(axis=1, ddof=1) / np.sqrt(n))
    passed = (stats.t.cdf(t, n - 1) < fitness.alpha).mean()
    return (f"per-seed losses: mean {mean:.4f} sd {sd:.4f} over {len(losses)} seeds; an "
            f"evaluation of {n} seeds passes the target {fitness.target} at p < {fitness.alpha} "
            f"with probability {passed:.3f} (simulated)")  # fmt: skip


if __name__ == "__main__":
    main()
