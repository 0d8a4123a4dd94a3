"""How diverse a circle-packing run stays: occupied cells per island, and the spread of every descriptor.

``run`` starts a real search (``python -m evolve``, circle packing) with the built-in
operators or the scripted command client (``tests/fixtures/scripted_model.py``, a real edit
of the prompt's program per call) and reports on it; ``report`` reports on runs already made.
For each run it prints the failures by cause, crossovers refused for lack of a second parent
after the 20th candidate, the occupied cells per island, and for every feature the circle
packing harness measures (``benchmarks/circle_packing/shape.py``) its range over all scored
candidates and over the best quarter, which is where the grid collapses as a run converges.

    python scripts/diversity.py run --client builtin --candidates 100 --seed 0
    python scripts/diversity.py run --client scripted --candidates 100 --seed 0
    python scripts/diversity.py report archives/circle_packing/2026-12-01_10-00-00
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPTED = f"{sys.executable} {REPO / 'tests' / 'fixtures' / 'scripted_model.py'} --seed 0"
LACK_OF_PARENTS = ("both parents are the same candidate", "needs two different parents")


def run(client: str, candidates: int, seed: int, extra: list[str]) -> Path:
    """One search in a fresh directory; returns the run directory."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"diversity-{client}-"))
    overrides = [
        f"search.max_candidates={candidates}",
        f"seed={seed}",
        "search.progress=false",
        f"hydra.run.dir={run_dir}",
    ]
    if client == "scripted":
        overrides += ["llm=command", f"llm.command={SCRIPTED}"]
    subprocess.run(
        [sys.executable, "-m", "evolve", *overrides, *extra],
        cwd=REPO,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return run_dir


def report(run_dir: Path) -> None:
    """Print the diversity figures of one run."""
    db = sqlite3.connect(f"file:{run_dir / 'archive.db'}?mode=ro", uri=True)
    rows = db.execute(
        "SELECT c.seq, e.status, e.fitness, e.descriptors, e.artifacts FROM candidates c "
        "JOIN evaluations e ON e.candidate = c.id WHERE e.stage = 'full' ORDER BY c.seq"
    ).fetchall()
    causes: Counter[str] = Counter()
    refused_late = 0
    scored = []
    for seq, status, fitness, descriptors, artifacts in rows:
        if status == "ok":
            scored.append((fitness, json.loads(descriptors)))
            continue
        error = json.loads(artifacts).get("error", "")
        causes[f"{status}: {error[:60]}"] += 1
        refused_late += seq > 20 and any(text in error for text in LACK_OF_PARENTS)
    print(f"run {run_dir}")
    print(f"  scored {len(scored)}, not scored {sum(causes.values())}")
    for cause, count in causes.most_common(6):
        print(f"    {count:4d}  {cause}")
    print(f"  crossovers refused for lack of parents after candidate 20: {refused_late}")
    cells = db.execute("SELECT island, COUNT(*) FROM elites GROUP BY island ORDER BY island")
    print("  occupied cells per island: " + ", ".join(f"{i}: {n}" for i, n in cells))
    best = sorted(scored, key=lambda row: -row[0])[: max(2, len(scored) // 4)]
    print(f"  {'feature':<22}{'range, all':>24}{'range, best quarter':>26}{'std, best q.':>14}")
    for name in sorted(scored[0][1]) if scored else ():
        every = [d[name] for _, d in scored if name in d]
        top = [d[name] for _, d in best if name in d]
        print(
            f"  {name:<22}{min(every):>11.4g} - {max(every):<10.4g}"
            f"{min(top):>13.4g} - {max(top):<10.4g}{statistics.pstdev(top):>12.4g}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("run", help="run a search, then report on it")
    start.add_argument("--client", choices=("builtin", "scripted"), default="builtin")
    start.add_argument("--candidates", type=int, default=100)
    start.add_argument("--seed", type=int, default=0)
    start.add_argument("overrides", nargs="*", help="further config overrides (key=value)")
    existing = sub.add_parser("report", help="report on runs already made")
    existing.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args()
    if args.command == "run":
        report(run(args.client, args.candidates, args.seed, args.overrides))
    else:
        for run_dir in args.runs:
            report(run_dir)


if __name__ == "__main__":
    main()
