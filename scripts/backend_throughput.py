"""Candidates per minute of the Ray backend against the local backend, same machine, same search.

Each run is a real search (``evolve.launch.runner.run``, built-in operators, no LLM) on a fitness
that sleeps ``--sleep`` seconds per candidate, with ``--workers`` slots, in its own Python
process; the backends alternate (local, ray, local, ray, ...) so that drift of the machine
hits both alike. Two figures per run, both from the archive's own timestamps:

- steady: candidates per minute between the first and the last result after the seed
  (what a long run sustains);
- overall: all candidates over the whole ``runner.run`` call, start-up included (for Ray
  that is starting a local cluster, several seconds).

With 2 workers and a 1 s fitness the ceiling is 120 per minute.

    .venv/bin/python scripts/backend_throughput.py --candidates 40 --repeat 2 --out /tmp/throughput
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCHMARK = REPO / "tests" / "backends" / "evolve_configs" / "benchmark" / "traced.yaml"


def one_run(backend: str, candidates: int, workers: int, sleep_s: float, run_dir: Path) -> dict:
    """Run one search in this process and measure it (called in a child process)."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from evolve.launch import runner
    from evolve.launch.config import as_dict
    from evolve.store.database import Store

    overrides = [
        f"backend={backend}",
        f"search.max_candidates={candidates}",
        f"search.workers={workers}",
        "search.progress=false",
    ]
    if backend == "ray":
        overrides.append("backend.address=local")
    with initialize_config_module(config_module="evolve.configs", version_base=None):
        cfg = as_dict(compose(config_name="config", overrides=overrides))
    cfg["benchmark"] = as_dict(OmegaConf.load(BENCHMARK))
    cfg["benchmark"]["fitness"]["sleep_s"] = sleep_s
    start = time.monotonic()
    summary = runner.run(cfg, run_dir)
    wall = time.monotonic() - start
    store = Store(run_dir / "archive.db", readonly=True)
    try:
        times = [
            row[0]
            for row in store.conn.execute(
                "SELECT e.created_at FROM evaluations e JOIN candidates c ON c.id = e.candidate "
                "WHERE c.operator != 'seed' ORDER BY e.created_at"
            )
        ]
        problems = store.integrity_problems()
    finally:
        store.close()
    steady = 60 * (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")
    return {
        "backend": backend,
        "evaluated": summary.evaluated,
        "failures": summary.failures,
        "wall_s": round(wall, 2),
        "steady_per_min": round(steady, 1),
        "overall_per_min": round(60 * summary.evaluated / wall, 1),
        "integrity_problems": problems,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=40, help="search budget per run")
    parser.add_argument("--workers", type=int, default=2, help="evaluation slots")
    parser.add_argument("--sleep", type=float, default=1.0, help="seconds the fitness sleeps")
    parser.add_argument("--repeat", type=int, default=2, help="runs per backend (alternating)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "throughput")))
    parser.add_argument("--one", choices=("local", "ray"), help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.one:  # child: one measured run, its figures as JSON on the last line
        result = one_run(args.one, args.candidates, args.workers, args.sleep, args.run_dir)
        print(json.dumps(result))
        return

    args.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    results = []
    for i in range(args.repeat):
        for backend in ("local", "ray"):
            run_dir = Path(tempfile.mkdtemp(prefix=f"throughput-{backend}-"))
            command = [
                sys.executable, __file__, "--one", backend, "--run-dir", str(run_dir),
                "--candidates", str(args.candidates), "--workers", str(args.workers),
                "--sleep", str(args.sleep),
            ]  # fmt: skip
            done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
            (args.out / f"{backend}-{i}.log").write_text(done.stdout + done.stderr)
            if done.returncode != 0:
                sys.exit(f"{backend} run {i} failed; see {args.out}/{backend}-{i}.log")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            results.append(result)
            print(
                f"{backend:5s} run {i}: steady {result['steady_per_min']:6.1f}/min, overall "
                f"{result['overall_per_min']:6.1f}/min, wall {result['wall_s']:.1f} s",
                flush=True,
            )

    def median(backend: str, key: str) -> float:
        return statistics.median(r[key] for r in results if r["backend"] == backend)

    table = {
        backend: {key: median(backend, key) for key in ("steady_per_min", "overall_per_min")}
        for backend in ("local", "ray")
    }
    ratio = table["ray"]["steady_per_min"] / table["local"]["steady_per_min"]
    report = {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "settings": vars(args) | {"out": str(args.out)},
        "runs": results,
        "median": table,
        "ray_over_local_steady": round(ratio, 3),
        "within_20_percent": ratio >= 0.8,
    }
    (args.out / "throughput.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"\n{'backend':8s} {'steady/min':>11s} {'overall/min':>12s}   (median of {args.repeat})")
    for backend, row in table.items():
        print(f"{backend:8s} {row['steady_per_min']:11.1f} {row['overall_per_min']:12.1f}")
    print(f"ray / local (steady): {ratio:.3f}  -> within 20%: {ratio >= 0.8}")


if __name__ == "__main__":
    main()
