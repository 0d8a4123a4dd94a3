"""Engine overhead per candidate at archive sizes 1k, 10k and 100k, and the time to reopen for resume.

A no-op fitness (it reads the candidate's numbers and returns at once) isolates the cost of
the engine itself: proposing with the built-in tweak operator, dedup checks, the worker
round trip, the store transactions and the archive update. Each archive is first filled
with N synthetic evaluated candidates, then the real search adds ``--extra`` more; the
median interval between consecutive results is the per-candidate overhead.

    python scripts/engine_overhead.py --sizes 1000 10000 100000 --extra 300
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from evolve.archive.grid import Archive
from evolve.backends import LocalBackend
from evolve.harness.fitness import Benchmark, EvalContext
from evolve.operators.builtin import BlockCrossover, Tweak, literals
from evolve.search.driver import Driver
from evolve.search.emitters import Emitter
from evolve.search.engine import Engine
from evolve.settings import SearchSettings
from evolve.store.database import Store
from evolve.types import (
    CandidateStatus,
    Descriptor,
    EdgeRole,
    EvalStatus,
    Evaluation,
    Objective,
    Proposal,
)

SEED = """# EVOLVE-BLOCK-START
A = 1.5
B = 40
C = 0.25
D = 7
E = 3.0
# EVOLVE-BLOCK-END
"""


class NoOp:
    """Scores the sum of the candidate's numbers without running anything."""

    objective = Objective(name="sum")
    descriptors = (
        Descriptor(name="a", low=0, high=5, bins=10),
        Descriptor(name="b", low=0, high=100, bins=10),
    )

    def evaluate(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        values = [float(lit.text) for lit in literals((workdir / "params.py").read_text())]
        return Evaluation(
            status=EvalStatus.OK, fitness=sum(values), descriptors={"a": values[0], "b": values[1]}
        )


def fill(store: Store, archive: Archive, count: int) -> None:
    """Add ``count`` evaluated candidates with lineage edges, as a long run would leave them."""
    rng = random.Random(0)
    previous = None
    with store.transaction():
        for seq in range(count):
            values = (
                rng.uniform(0, 5),
                rng.randint(0, 100),
                rng.random(),
                rng.randint(1, 9),
                rng.random(),
            )
            text = SEED.replace("A = 1.5", f"A = {values[0]:.6f}").replace(
                "B = 40", f"B = {values[1]}"
            )
            text = text.replace("C = 0.25", f"C = {values[2]:.6f}").replace(
                "E = 3.0", f"E = {values[4]:.6f}"
            )
            parents = ((previous, EdgeRole.MUTATION),) if previous else ()
            proposal = Proposal(
                files={"params.py": text}, operator="seed" if seq == 0 else "tweak", parents=parents
            )
            store.add_candidate(proposal, seq=seq, status=CandidateStatus.DONE)
            evaluation = Evaluation(
                status=EvalStatus.OK,
                fitness=sum(values),
                descriptors={"a": values[0], "b": float(values[1])},
            )
            store.add_evaluation(proposal.id, evaluation)
            for island in range(archive.islands) if seq == 0 else (seq % archive.islands,):
                archive.add(proposal.id, evaluation, island=island)
            previous = proposal.id if rng.random() < 0.5 or previous is None else previous


def make_driver(path: Path, seed_dir: Path, budget: int) -> tuple[Driver, LocalBackend]:
    store = Store(path)
    fitness = NoOp()
    archive = Archive(
        store=store, objective=fitness.objective, descriptors=fitness.descriptors, islands=2
    )
    benchmark = Benchmark(name="noop", fitness=fitness, seed_dir=seed_dir, editable=("params.py",))
    emitter = Emitter(archive=archive, operators=[(Tweak(), 3.0), (BlockCrossover(), 1.0)])
    backend = LocalBackend(fitness=fitness, workers=1)
    settings = SearchSettings(max_candidates=budget, progress=False, seed=1)
    engine = Engine(
        store=store, archive=archive, emitter=emitter, benchmark=benchmark, seed=settings.seed
    )
    return Driver(engine=engine, backend=backend, settings=settings), backend


def measure(size: int, extra: int, root: Path) -> dict[str, float]:
    seed_dir = root / "seed"
    seed_dir.mkdir(exist_ok=True)
    (seed_dir / "params.py").write_text(SEED)
    path = root / f"archive-{size}.db"
    store = Store(path)
    fill(
        store,
        Archive(store=store, objective=NoOp.objective, descriptors=NoOp.descriptors, islands=2),
        size,
    )
    store.close()

    start = time.perf_counter()
    driver, backend = make_driver(
        path, seed_dir, size + extra
    )  # the engine reads the counts a resume needs
    reopen_s = time.perf_counter() - start
    try:
        asyncio.run(driver.run())
    finally:
        backend.close()
    store = driver.engine.store
    times = [
        row[0]
        for row in store.conn.execute(
            "SELECT created_at FROM stats ORDER BY id DESC LIMIT ?", (extra,)
        )
    ]
    intervals = [1000 * (a - b) for a, b in zip(times, times[1:], strict=False)]
    store.close()
    return {
        "size": size,
        "median_ms": statistics.median(intervals),
        "p90_ms": sorted(intervals)[int(0.9 * len(intervals))],
        "reopen_s": reopen_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument(
        "--extra", type=int, default=300, help="candidates the search adds and times"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(size, args.extra, Path(tmp)) for size in args.sizes]
    print(f"{'archive size':>12}  {'median ms/cand':>14}  {'p90 ms':>8}  {'reopen s':>8}")
    for row in rows:
        print(
            f"{row['size']:>12}  {row['median_ms']:>14.2f}  {row['p90_ms']:>8.2f}  {row['reopen_s']:>8.3f}"
        )
    ratio = rows[-1]["median_ms"] / rows[0]["median_ms"]
    print(f"ratio largest/smallest: {ratio:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "ratio": ratio}, indent=2))


if __name__ == "__main__":
    main()
