"""Where a speedrun evaluation's time goes besides training, for this tree and a baseline commit in one run.

Each measurement is one seed of ``speedrun_cpu`` (or the configuration named) evaluated through
its real fitness, in four arms: the baseline without a compile cache (as the GPU campaign ran
it), this tree without one, with one, and with one on the GPU path (the slot names GPU "0":
the export and evaluation processes start with the training and the export runs beside it,
on the CPU here). A cache's warm-up runs once per arm beforehand and is stated apart (once per
run of a search, not per evaluation). The arms alternate, so a change of the machine's load
falls on all alike. It prints each phase's seconds (``evolve.harness.phases``), the timed
training and the overhead (wall - training) per arm, and the load before and after::

    python scripts/speedrun_overhead.py --baseline 6c13918 --repeats 3

The baseline is the commit's files (``git archive``) imported ahead of the installed package.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAPPED = {"benchmarks": "benchmarks", "configs": "configs"}
"""setup.py's mapping of top-level folders into the package, made as links in a baseline tree."""


def baseline_tree(commit: str, into: Path) -> Path:
    """The files of ``commit`` under ``into``, importable as ``evolve`` from there."""
    archive = subprocess.run(["git", "archive", commit], cwd=REPO, capture_output=True, check=True)
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    for name, folder in MAPPED.items():
        (into / "evolve" / name).symlink_to(into / folder, target_is_directory=True)
    return into


def measure(config: str, seed: int, scratch: Path, cache: Path | None, gpu: str | None) -> dict:
    """One seed's evaluation with the evolve found first on sys.path: its phases and figures."""
    from evolve.benchmarks.speedrun.fitness import SEED_PROGRAM

    import evolve
    from evolve.harness import phases
    from evolve.harness.fitness import EvalContext
    from evolve.launch.config import build_benchmark, compose

    overrides = [f"benchmark={config}", "benchmark.fitness.n_seeds=1"]
    if cache is not None:
        overrides.append(f"+benchmark.fitness.compile_cache={cache}")  # speedrun_cpu sets none
    fitness = build_benchmark(compose(overrides)["benchmark"]).fitness
    ctx = EvalContext(seed=seed, scratch=scratch, gpu=gpu)
    began = time.monotonic()
    if cache is not None:
        fitness.cache_warmup(SEED_PROGRAM, ctx)
    warmup_s = time.monotonic() - began
    with phases.timeline("harness") as line:
        [record] = fitness.run_seeds(SEED_PROGRAM, [seed], ctx)
    return {
        "evolve": str(Path(evolve.__file__).parent),
        "status": record.status.value,
        "reason": record.reason,
        "loss": record.loss,
        "train_s": record.train_s,
        "wall_s": record.wall_s,
        "cache_warmup_s": warmup_s,
        "phases": line.seconds(time.monotonic()),
    }


ARMS = {  # name -> (baseline tree?, compile cache?, the slot's GPU)
    "baseline": (True, False, None),
    "this": (False, False, None),
    "this+cache": (False, True, None),
    "this+cache+gpu-path": (False, True, "0"),
}


def child(arm: str, tree: Path | None, args: argparse.Namespace, index: int, work: Path) -> dict:
    """``measure`` of ``arm`` in a fresh process importing ``tree`` (None: this one)."""
    _, cached, gpu = ARMS[arm]
    cache = str(work / f"cache-{arm}") if cached else "-"
    arguments = [args.config, str(args.seed), str(work / f"{arm}-{index}"), cache, gpu or "-"]
    return run_child(Path(__file__), arm, arguments, tree, work)


def run_child(script: Path, arm: str, arguments: list[str], tree: Path | None, work: Path) -> dict:
    """The JSON line ``script --child ARGUMENTS`` prints last, run in ``work`` by a fresh process
    that imports ``tree`` ahead of the installed package (None: the installed one)."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
    command = [sys.executable, str(script.resolve()), "--child", *arguments]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=work)
    if done.returncode != 0:
        raise SystemExit(f"the {arm} measurement failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(name: str, runs: list[dict]) -> list[str]:
    """Mean seconds per phase, training and overhead over ``runs``."""
    names = list(dict.fromkeys(p for run in runs for p in run["phases"]))
    mean = {p: statistics.fmean(run["phases"].get(p, 0.0) for run in runs) for p in names}
    train = statistics.fmean(run["train_s"] or 0.0 for run in runs)
    wall = statistics.fmean(run["wall_s"] for run in runs)
    overhead = statistics.fmean(
        sum(run["phases"].values()) - (run["train_s"] or 0.0) for run in runs
    )
    return [
        f"{name}, evolve from {runs[0]['evolve']}: {len(runs)} runs, status {[r['status'] for r in runs]}, "
        f"loss {[round(r['loss'], 4) if r['loss'] else None for r in runs]}",
        f"  training {train:.2f} s; run wall {wall:.2f} s; evaluation wall - training "
        f"{overhead:.2f} s ({100 * overhead / max(train, 1e-9):.0f}% of training); compile cache warm-up "
        f"(once per cache) {max(r['cache_warmup_s'] for r in runs):.1f} s",
        "  phases: " + ", ".join(f"{p} {s:.2f}" for p, s in mean.items()),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", help="the commit to compare with (required)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--config", default="speedrun_cpu", help="the benchmark configuration")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        config, seed, scratch, cache, gpu = args.child
        made = measure(config, int(seed), Path(scratch), None if cache == "-" else Path(cache),
                       None if gpu == "-" else gpu)  # fmt: skip
        print(json.dumps(made))
        return
    if not args.baseline:
        parser.error(
            "--baseline COMMIT is required (e.g. the branch's base: git merge-base HEAD main)"
        )
    print(f"load before: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="speedrun-overhead-") as tmp:
        work = Path(tmp)
        tree = baseline_tree(args.baseline, work / "baseline-tree")
        runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
        for index in range(args.repeats):
            for arm in list(ARMS) if index % 2 == 0 else reversed(ARMS):
                runs[arm].append(child(arm, tree if ARMS[arm][0] else None, args, index, work))
                print(f"{arm} #{index}: {json.dumps(runs[arm][-1])}", flush=True)
    for arm, made in runs.items():
        print("\n".join(summary(f"{arm} ({args.baseline})" if ARMS[arm][0] else arm, made)))
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
