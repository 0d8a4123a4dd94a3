"""Do two evaluations side by side slow each other? The honest nanochat seed at its CPU scale.

Evaluates the seed through the local backend with two slots (each its own cores, issue 35):
alone on slot 0 (slot 1 idle), then two seeds side by side on both slots, for ``--rounds``
rounds. Prints each evaluation (training-phase wall time, steps, tokens per second, val_bpb)
as a JSON line, then the means side by side and alone, their ratios, the ``slowdown`` (time
per training token side by side over alone; goal: at most 1.10, on an otherwise idle
machine: other work on the machine lands on the slots' cores too) and the load averages.

A loaded machine hides what the slots do to each other, so a direct probe runs first: a
fixed amount of one-thread matrix work on slot 0's cores alone, then on both slots at once;
its CPU seconds side by side over alone (``probe_cpu_ratio``) are what the two slots cost
each other (memory bandwidth, caches, a shared physical core), whatever else runs; its wall
seconds include the other work::

    python scripts/cpu_allowance.py --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace

from evolve.benchmarks.nanochat import scales
from evolve.benchmarks.nanochat.fitness import NanochatFitness

from evolve.backends import LocalBackend
from evolve.sandbox.cores import inherited, split
from evolve.types import Evaluation, Job

PROBE = """
import json, time, torch
torch.set_num_threads(1)
a = torch.randn(256, 256)
wall, cpu = time.monotonic(), time.process_time()
for _ in range(8000):
    a @ a
print(json.dumps({"wall_s": time.monotonic() - wall, "cpu_s": time.process_time() - cpu}))
"""
KEPT = ("train_wall_s", "startup_s", "training_s", "steps", "tokens_per_s", "val_bpb")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def row(evaluation: Evaluation, mode: str, slot: int, seed: int, wall_s: float) -> dict:
    if not evaluation.ok:
        raise SystemExit(f"the seed failed ({mode}, slot {slot}): {dict(evaluation.artifacts)}")
    kept = {k: round(float(evaluation.metrics[k]), 4) for k in KEPT}
    return {"mode": mode, "slot": slot, "seed": seed, "eval_wall_s": round(wall_s, 2), **kept}


def probe(slots: list[tuple[int, ...]]) -> list[dict]:
    """The probe on each of ``slots`` at once (each on its slot's cores); what each measured."""
    running = []
    for own in slots:
        with inherited(own):
            running.append(subprocess.Popen([sys.executable, "-c", PROBE], stdout=subprocess.PIPE))
    return [json.loads(p.communicate()[0]) for p in running]


def probes(rounds: int) -> dict:
    """The probe alone on slot 0 and on two slots at once, ``rounds`` times each, interleaved."""
    slots, alone, pair = split(2), [], []
    for _ in range(rounds):
        alone += probe(slots[:1])
        pair += probe(slots)
    mean = {
        k: {
            m: statistics.mean(r[k] for r in rows)
            for m, rows in (("alone", alone), ("side_by_side", pair))
        }
        for k in ("cpu_s", "wall_s")
    }
    return {
        "probe_cpu_s": mean["cpu_s"],
        "probe_wall_s": mean["wall_s"],
        "probe_cpu_ratio": round(mean["cpu_s"]["side_by_side"] / mean["cpu_s"]["alone"], 3),
        "probe_wall_ratio": round(mean["wall_s"]["side_by_side"] / mean["wall_s"]["alone"], 3),
    }


async def timed(backend: LocalBackend, slot: int, job: Job) -> tuple[Evaluation, float]:
    start = time.monotonic()
    evaluation = await backend.evaluate(slot, job)
    return evaluation, time.monotonic() - start


async def measure(backend: LocalBackend, job: Job, rounds: int) -> list[dict]:
    rows = []
    for round_ in range(rounds):
        seed = 2 * round_
        evaluation, wall = await timed(backend, 0, replace(job, seed=seed))
        rows.append(row(evaluation, "alone", 0, seed, wall))
        print(json.dumps(rows[-1]), flush=True)
        pair = [replace(job, seed=seed + s) for s in range(2)]
        done = await asyncio.gather(*(timed(backend, s, j) for s, j in enumerate(pair)))
        for slot, (evaluation, wall) in enumerate(done):
            rows.append(row(evaluation, "side_by_side", slot, seed + slot, wall))
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--data-dir", default=None, help="nanochat data (default: its usual)")
    args = parser.parse_args()
    fitness = NanochatFitness(
        scale="cpu", data_dir=args.data_dir, layered={"local_check": False, "short_run_steps": 0}
    )
    seed_dir = scales.SCALES["cpu"].seed_dir
    files = {p.name: p.read_text() for p in sorted(seed_dir.glob("*.py"))}
    job = Job(
        candidate_id="cpu-allowance-seed",
        files=files,
        seed=0,
        timeout_s=fitness.benchmark_overrides["timeout_s"],
    )
    before = load()
    direct = probes(args.rounds)
    print(json.dumps(direct), flush=True)
    backend = LocalBackend(fitness=fitness, workers=2)
    try:
        print(json.dumps({"slot_cores": backend.cores, "load_before": before}), flush=True)
        rows = asyncio.run(measure(backend, job, args.rounds))
    finally:
        backend.close()
    summary = {"load_after": load(), **direct}
    for key in ("train_wall_s", "eval_wall_s", "tokens_per_s", "val_bpb"):
        alone = statistics.mean(r[key] for r in rows if r["mode"] == "alone")
        pair = statistics.mean(r[key] for r in rows if r["mode"] == "side_by_side")
        summary[key] = {"alone": round(alone, 4), "side_by_side": round(pair, 4)}
        summary[key]["ratio"] = round(pair / alone, 3)
    # the budget is fixed, so the slowdown shows in the training rate: seconds per token
    summary["slowdown"] = round(
        summary["tokens_per_s"]["alone"] / summary["tokens_per_s"]["side_by_side"], 3
    )
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
