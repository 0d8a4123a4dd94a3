"""Candidates per minute and busy evaluation slots with many LLM proposals in flight, against a mock model.

A local OpenAI-compatible server on 127.0.0.1 (``tests/fixtures/mock_openai.py``: TCP_NODELAY
on, a fixed answer latency, answers that are real SEARCH/REPLACE edits of the prompt's
program) is called through the real litellm path (``llm=local``, ``llm.api_base``); the
fitness is the toy benchmark's, sleeping ``--eval`` seconds. Two measurements:

``sweep``: one real search (``evolve.launch.runner.run``) per value of
``search.max_proposals_in_flight``, each proposing for ``--wall`` seconds; prints candidates
per minute and the fraction of wall time the evaluation slots were busy (the fitness's own
time over slots x the search's time, from the archive's timestamps), overall (from the seed
program's verdict) and steady (from the first result after it).

    python scripts/llm_throughput.py sweep --latency 2 --eval 0.5 --workers 4 --in-flight 1 2 4 8 12 16

``overhead``: the engine's own time per candidate on the LLM path with instant answers and
an instant fitness, in archives already holding N candidates: ``Engine.ask`` + ``admit`` +
``tell`` + the operator's work outside the model call (prompt rendering, parsing the answer),
median over ``--extra`` candidates, one at a time.

    python scripts/llm_throughput.py overhead --sizes 1000 10000 --extra 200
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

from omegaconf import OmegaConf  # noqa: E402

from evolve.archive.grid import Archive  # noqa: E402
from evolve.backends import LocalBackend  # noqa: E402
from evolve.harness.fitness import Benchmark  # noqa: E402
from evolve.launch import runner  # noqa: E402
from evolve.launch.config import as_dict  # noqa: E402
from evolve.llm import LLMClient, LLMSettings  # noqa: E402
from evolve.operators.mutate import Diff  # noqa: E402
from evolve.search.driver import Driver  # noqa: E402
from evolve.search.emitters import Emitter  # noqa: E402
from evolve.search.engine import Engine  # noqa: E402
from evolve.settings import SearchSettings  # noqa: E402
from evolve.store.database import Store  # noqa: E402
from tests.fixtures.mock_openai import MockServer  # noqa: E402

TOY = REPO / "tests" / "fixtures" / "evolve_configs" / "benchmark" / "toy.yaml"


# --- sweep ------------------------------------------------------------------------------------------


def toy_config(
    server: MockServer, *, workers: int, in_flight: int, wall: float, eval_s: float
) -> dict:
    """The resolved config of a toy run proposed by the mock server (as ``python -m evolve`` builds it)."""
    from hydra import compose, initialize_config_module

    overrides = [
        "llm=local",
        f"llm.api_base={server.api_base}",
        "llm.model=openai/scripted",
        f"llm.max_concurrency={in_flight}",  # the mock server takes as many calls as are in flight
        "operators.builtin.tweak=0",
        "operators.builtin.crossover=0",
        f"search.workers={workers}",
        f"search.max_proposals_in_flight={in_flight}",
        f"search.max_wall_s={wall}",
        "search.max_candidates=100000",
        "search.progress=false",
    ]
    with initialize_config_module(config_module="evolve.configs", version_base=None):
        cfg = as_dict(compose(config_name="config", overrides=overrides))
    cfg["benchmark"] = as_dict(OmegaConf.load(TOY))
    cfg["benchmark"]["fitness"]["sleep_s"] = eval_s
    return cfg


def busy_figures(db: Path, slots: int) -> dict[str, float]:
    """Candidates per minute and busy fraction of the slots, from the archive's timestamps."""
    store = Store(db, readonly=True)
    try:
        seed = store.seed_candidate()
        rows = store.conn.execute(
            "SELECT v.candidate, v.created_at - v.wall_s, v.created_at, v.wall_s FROM evaluations v "
            "WHERE v.stage != 'reevaluation' AND v.status != 'rejected' ORDER BY v.created_at"
        ).fetchall()
    finally:
        store.close()
    seed_end = next(end for cid, _, end, _ in rows if cid == seed.id)
    after = [row for row in rows if row[0] != seed.id]
    end = max(row[2] for row in after)
    first = min(row[1] for row in after)
    busy = sum(row[3] for row in after)
    return {
        "candidates": len(after),
        "per_minute": 60 * len(after) / (end - seed_end),
        "busy": busy / (slots * (end - seed_end)),
        "busy_steady": busy / (slots * (end - first)),
    }


def sweep(args: argparse.Namespace) -> None:
    print(
        f"answers {args.latency} s, evaluations {args.eval} s, {args.workers} slots, "
        f"{args.wall} s of proposing per run; ceiling {60 * args.workers / args.eval:.0f} per minute"
    )
    print(f"{'in flight':>9}  {'cand/min':>8}  {'busy':>6}  {'steady':>6}  {'max calls seen':>14}")
    for in_flight in args.in_flight:
        server = MockServer(latency_s=args.latency).start()
        try:
            with tempfile.TemporaryDirectory() as tmp:
                cfg = toy_config(
                    server,
                    workers=args.workers,
                    in_flight=in_flight,
                    wall=args.wall,
                    eval_s=args.eval,
                )
                runner.run(cfg, Path(tmp))
                row = busy_figures(Path(tmp) / "archive.db", args.workers)
        finally:
            server.stop()
        print(
            f"{in_flight:>9}  {row['per_minute']:>8.1f}  {row['busy']:>6.1%}  "
            f"{row['busy_steady']:>6.1%}  {server.max_in_flight:>14}"
        )


# --- overhead ---------------------------------------------------------------------------------------


def timed(spent: dict[str, list[float]], name: str, method):
    """``method`` wrapped so that each call's duration is appended to ``spent[name]``."""
    if asyncio.iscoroutinefunction(method):

        @functools.wraps(method)
        async def run_async(*a, **kw):
            start = time.perf_counter()
            try:
                return await method(*a, **kw)
            finally:
                spent[name].append(time.perf_counter() - start)

        return run_async

    @functools.wraps(method)
    def run(*a, **kw):
        start = time.perf_counter()
        try:
            return method(*a, **kw)
        finally:
            spent[name].append(time.perf_counter() - start)

    return run


def measure_overhead(size: int, extra: int, root: Path, server: MockServer) -> dict[str, float]:
    import engine_overhead  # the filled archives and the instant fitness of the built-in benchmark

    seed_dir = root / "seed"
    seed_dir.mkdir(exist_ok=True)
    (seed_dir / "params.py").write_text(engine_overhead.SEED)
    path = root / f"archive-{size}.db"
    store = Store(path)
    fitness = engine_overhead.NoOp()
    archive = Archive(
        store=store, objective=fitness.objective, descriptors=fitness.descriptors, islands=2
    )
    engine_overhead.fill(store, archive, size)
    benchmark = Benchmark(name="noop", fitness=fitness, seed_dir=seed_dir, editable=("params.py",))
    settings = LLMSettings.from_config(
        {
            "model": "openai/scripted",
            "api_base": server.api_base,
            "pricing": {"input_per_mtok": 0, "output_per_mtok": 0},
        }
    )
    client = LLMClient(settings, store=store)
    emitter = Emitter(
        archive=archive,
        operators=[(Diff(client=client, model="openai/scripted"), 1.0)],
    )
    engine = Engine(store=store, archive=archive, emitter=emitter, benchmark=benchmark, seed=1)
    spent: dict[str, list[float]] = defaultdict(list)
    for name in ("ask", "propose", "admit", "tell"):
        setattr(engine, name, timed(spent, name, getattr(engine, name)))
    client.complete = timed(spent, "model call", client.complete)
    backend = LocalBackend(fitness=fitness, workers=1)
    driver = Driver(
        engine=engine,
        backend=backend,
        settings=SearchSettings(max_candidates=engine.evaluated + extra, progress=False, seed=1),
    )
    try:
        asyncio.run(driver.run())
    finally:
        backend.close()
        store.close()
    n = min(len(spent["tell"]), len(spent["ask"]))
    per_candidate = [
        1000
        * (
            spent["ask"][i]
            + spent["admit"][i]
            + spent["tell"][i]
            + spent["propose"][i]
            - spent["model call"][i]
        )
        for i in range(n)
    ]
    return {
        "size": size,
        "median_ms": statistics.median(per_candidate),
        "p90_ms": sorted(per_candidate)[int(0.9 * n)],
        "model_call_ms": 1000 * statistics.median(spent["model call"]),
        **{f"{k}_ms": 1000 * statistics.median(spent[k]) for k in ("ask", "admit", "tell")},
    }


def overhead(args: argparse.Namespace) -> None:
    server = MockServer(latency_s=0.0).start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rows = [measure_overhead(size, args.extra, Path(tmp), server) for size in args.sizes]
    finally:
        server.stop()
    print(
        f"{'archive':>8}  {'engine ms/cand':>14}  {'p90':>6}  {'ask':>6}  {'admit':>6}  {'tell':>6}  {'model call':>10}"
    )
    for row in rows:
        print(
            f"{row['size']:>8}  {row['median_ms']:>14.2f}  {row['p90_ms']:>6.2f}  {row['ask_ms']:>6.2f}  "
            f"{row['admit_ms']:>6.2f}  {row['tell_ms']:>6.2f}  {row['model_call_ms']:>10.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    s = commands.add_parser(
        "sweep", help="candidates per minute and busy slots per proposals in flight"
    )
    s.add_argument("--latency", type=float, default=2.0, help="seconds per model answer")
    s.add_argument("--eval", type=float, default=0.5, help="seconds per evaluation")
    s.add_argument("--workers", type=int, default=4, help="evaluation slots")
    s.add_argument("--wall", type=float, default=30.0, help="seconds of proposing per run")
    s.add_argument("--in-flight", type=int, nargs="+", default=[1, 2, 4, 8, 12, 16])
    o = commands.add_parser("overhead", help="the engine's time per candidate on the LLM path")
    o.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    o.add_argument("--extra", type=int, default=200, help="candidates timed per size")
    args = parser.parse_args()
    if args.command == "sweep":
        sweep(args)
    else:
        overhead(args)


if __name__ == "__main__":
    main()
