"""Assembles a run from its typed settings (store, archive, operators, backend, engine, driver) and runs it."""

from __future__ import annotations

import asyncio
import json
import logging
import platform
import signal
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from evolve.archive.grid import Archive
from evolve.backends import Backend, LocalBackend
from evolve.launch.config import build_settings
from evolve.llm import LLMClient, LLMSettings, LLMStop, preflight, usage_line
from evolve.operators.catalog import build_operators
from evolve.research.plots import write_plots
from evolve.research.review import Reviewer
from evolve.research.summary import Summariser
from evolve.sandbox import lifetime, unreadable
from evolve.search.driver import Driver, Summary
from evolve.search.emitters import Emitter
from evolve.search.engine import Engine
from evolve.settings import RunSettings
from evolve.store import runlock
from evolve.store.database import ArchiveFileError, Store
from evolve.types import EvolveError

log = logging.getLogger("evolve")


def make_backend(settings: RunSettings) -> Backend:
    """The configured evaluation backend."""
    benchmark = settings.benchmark
    if settings.backend == "ray":
        # importing this module does not import Ray: building the backend does, or names the fix
        from evolve.backends.ray import RayBackend

        return RayBackend.from_config(  # the ray group's own keys are RayBackend's to check
            settings.config["backend"],
            fitness=benchmark.fitness,
            gpus_per_eval=benchmark.gpus,
            workers=settings.workers,
            harness=settings.config["benchmark"].get("harness")
            or (),  # as written: resolved per node
        )
    return LocalBackend(
        fitness=benchmark.fitness, gpus_per_eval=benchmark.gpus, workers=settings.workers
    )


def record_problem(store: Store, settings: RunSettings) -> None:
    """Write the objective and the grid's axes into ``state``, so readers need no config to draw them."""
    fitness = settings.benchmark.fitness
    with store.transaction():
        store.set_state(
            "objective",
            {"name": fitness.objective.name, "direction": fitness.objective.direction.value},
        )
        store.set_state(
            "grid",
            {
                "islands": settings.archive.islands,
                "descriptors": [
                    {"name": d.name, "low": d.low, "high": d.high, "bins": d.bins}
                    for d in fitness.descriptors
                ],
            },
        )


def run(
    settings: RunSettings | Mapping[str, Any], run_dir: Path, *, resumed: bool = False
) -> Summary:
    """Run (or continue) the search ``settings`` describe in ``run_dir``; returns how it ended.

    Args:
        settings: the run's settings (``evolve.launch.config.build_settings``), or a resolved config
            to build them from.
        run_dir: the run directory (its ``archive.db`` is created or continued).
        resumed: continue the run in ``run_dir``; otherwise an archive there is refused.
    """
    if not isinstance(settings, RunSettings):
        settings = build_settings(settings)
    with unreadable.hidden(run_dir):  # the archive: every earlier evaluation, output included
        return _run(settings, run_dir, resumed=resumed)


def _run(settings: RunSettings, run_dir: Path, *, resumed: bool) -> Summary:
    with lifetime.marked() as token:  # every process started from here carries the session's mark
        return _run_marked(settings, run_dir, token, resumed=resumed)


def _run_marked(settings: RunSettings, run_dir: Path, token: str, *, resumed: bool) -> Summary:
    backend = make_backend(settings)  # a backend that cannot start fails before anything is written
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with runlock.hold(run_dir), lifetime.session(run_dir, token) as killed:
            if killed:
                log.warning(
                    "ended %d process(es) a killed session of this run left running", killed
                )
            store = Store(run_dir / "archive.db")
            try:
                if not resumed:
                    _check_unused(store, run_dir)
                return _search(settings, run_dir, store, backend, resumed=resumed)
            finally:
                store.close()
    finally:
        backend.close()


def _check_unused(store: Store, run_dir: Path) -> None:
    """A new run refuses an archive that already holds one (``resume=`` continues it instead)."""
    first = store.first_run()
    if first is not None:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(first["started_at"]))
        raise EvolveError(
            f"{run_dir} already holds a run (started {started}); continue it with resume={run_dir}, "
            "or start a new run in another directory (hydra.run.dir=...)"
        )


def _search(
    settings: RunSettings, run_dir: Path, store: Store, backend: Backend, *, resumed: bool
) -> Summary:
    benchmark, search = settings.benchmark, settings.search
    if resumed:
        log.info("resuming %s: %d candidates so far", run_dir, store.count())
    if not settings.llm.enabled:
        log.warning(
            "no model configured (llm.model is empty): using the built-in operators tweak and crossover, no LLM"
        )
    killed, lost = store.end_dead_sessions()
    if killed or lost:
        log.warning(
            "an earlier session was killed: %d LLM call(s) it had in flight are recorded lost", lost
        )
    run_id = store.start_run(
        config=settings.config,
        harness_hash=benchmark.harness_hash(),
        seed=search.seed,
        hardware=f"{platform.node()} {platform.machine()}",
    )
    record_problem(store, settings)
    archive = Archive(
        store=store,
        objective=benchmark.fitness.objective,
        descriptors=benchmark.fitness.descriptors,
        **asdict(settings.archive),
    )
    # one client makes every LLM call of the run, the novelty check's embeddings included:
    # one budget, one response cache, one record
    client = (
        LLMClient(settings.llm, store=store)
        if settings.llm.enabled or settings.archive.novelty.embedding_model is not None
        else None
    )
    llm = client if settings.llm.enabled else None  # the client that asks models (not embeddings)
    cost = client.spent if client is not None else (lambda: 0.0)
    operators = build_operators(settings.builtin, llm)
    emitter = Emitter(archive=archive, operators=operators, **asdict(settings.emitter))
    log.info(
        "benchmark %s: %s is %s; %d evaluation slot(s); budget %d candidates",
        benchmark.name,
        benchmark.fitness.objective.name,
        benchmark.fitness.objective.direction.name.lower(),
        backend.slots,
        search.max_candidates,
    )
    engine = Engine(
        store=store,
        archive=archive,
        emitter=emitter,
        benchmark=benchmark,
        seed=search.seed,
        migration_interval=search.migration_interval,
        cost=cost,
        notebook_chars=llm.settings.notebook_chars if llm is not None else 0,
        summariser=Summariser(
            client=llm,
            model=llm.settings.models[0][0],
            benchmark=benchmark,
            every=llm.settings.notebook_summary_every,
        )
        if llm is not None
        else None,
        llm=client,
    )
    driver = Driver(
        engine=engine,
        backend=backend,
        settings=search,
        noise=settings.noise,
        audit=settings.audit,
        review_diff=Reviewer(client=llm, model=llm.settings.models[0][0], benchmark=benchmark)
        if llm is not None
        else None,
        budget_errors=(LLMStop,),
        replay=_replay_events(settings.llm),
        run_dir=run_dir,
        cost=cost,
    )
    status = "interrupted"
    try:
        warnings = asyncio.run(preflight(llm.settings)) if llm is not None else []
        for warning in warnings:  # every model the operators use, before anything is evaluated
            log.warning("%s", warning)
        since = client.ledger.last_id() if client is not None else 0
        summary = asyncio.run(_drive(driver, client))
        if client is not None and (error := client.ledger.only_failures_since(since)):
            status = "failed"
            raise LLMStop(
                f"every LLM call of this session failed ({summary.reason}); the last: "
                f"{error[:500]}. Fix the server or the model (llm.api_base, llm.model), then "
                "resume the run"
            )
        if client is not None:
            log.info("LLM use so far (this archive):\n%s", usage_line(client.ledger.summary()))
        status = "stopped" if summary.reason.startswith(STOPPED) else "finished"
    finally:
        store.finish_run(run_id, status=status)
    (run_dir / "summary.json").write_text(json.dumps(summary.__dict__, indent=2))
    written = write_plots(store, run_dir)
    log.info("plots: %s", ", ".join(str(p) for p in written))
    return summary


STOPPED = "stopped by SIGTERM"


async def _drive(driver: Driver, llm: Any) -> Summary:
    """Run the driver; SIGTERM stops it like Ctrl-C but ends with a summary, and the LLM client is closed."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    terminated = []

    def terminate() -> None:
        terminated.append(True)
        task.cancel()

    loop.add_signal_handler(signal.SIGTERM, terminate)
    try:
        return await driver.run()
    except asyncio.CancelledError:
        if not terminated:
            raise
        log.warning(
            "SIGTERM: stopped; the archive is consistent. Continue with: python -m evolve resume=%s",
            driver.run_dir,
        )
        return driver.summary(f"{STOPPED}; continue with: python -m evolve resume={driver.run_dir}")
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        close = getattr(llm, "close", None)  # ends a command provider's process group (evolve.llm)
        if close is not None:
            result = close()
            if asyncio.iscoroutine(result):
                await result


def _replay_events(llm: LLMSettings) -> list[tuple[int, str, int]] | None:
    """The recorded order of events of the run an offline replay reproduces (``llm.replay_from``)."""
    if not (llm.offline and llm.replay_from):
        return None
    path = Path(llm.replay_from)
    try:
        store = Store(path / "archive.db" if path.is_dir() else path, readonly=True)
    except ArchiveFileError:  # made before runs recorded their schedule: its answers still serve
        return None
    try:
        return store.events()
    finally:
        store.close()
