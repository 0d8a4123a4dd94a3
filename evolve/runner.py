"""Assembles a run from a resolved config (store, archive, operators, backend, search) and runs it."""

from __future__ import annotations

import asyncio
import json
import logging
import platform
from pathlib import Path
from typing import Any

from evolve.archive import Archive
from evolve.backends import LocalBackend
from evolve.config import ConfigError, build_benchmark, search_settings, workers
from evolve.emitters import Emitter
from evolve.operators.catalog import build_operators, uses_llm
from evolve.search import Search, Summary
from evolve.store import Store

log = logging.getLogger("evolve")


def make_backend(cfg: dict[str, Any], benchmark: Any) -> Any:
    """The configured evaluation backend."""
    kind = cfg["backend"].get("name", "local")
    if kind == "local":
        return LocalBackend(
            fitness=benchmark.fitness, gpus_per_eval=benchmark.gpus, workers=workers(cfg)
        )
    if kind == "ray":
        # importing this module does not import Ray: building the backend does, or names the fix
        from evolve.backends.ray import RayBackend

        return RayBackend.from_config(
            cfg["backend"],
            fitness=benchmark.fitness,
            gpus_per_eval=benchmark.gpus,
            workers=workers(cfg),
        )
    raise ConfigError(f"backend {kind!r} unknown; available: local, ray")


def run(cfg: dict[str, Any], run_dir: Path, *, resumed: bool = False) -> Summary:
    """Run (or continue) the search described by ``cfg`` in ``run_dir``; returns how it ended."""
    run_dir.mkdir(parents=True, exist_ok=True)
    allowed = tuple(cfg.get("allow_targets") or ())
    benchmark = build_benchmark(cfg["benchmark"], allowed=allowed)
    settings = search_settings(cfg)
    store = Store(run_dir / "archive.db")
    try:
        if resumed:
            log.info("resuming %s: %d candidates so far", run_dir, store.count())
        if not uses_llm(cfg):
            log.warning(
                "no model configured (llm.model is empty): using the built-in operators tweak and crossover, no LLM"
            )
        run_id = store.start_run(
            config=cfg,
            harness_hash=benchmark.harness_hash(),
            seed=settings.seed,
            hardware=f"{platform.node()} {platform.machine()}",
        )
        archive = Archive(
            store=store,
            objective=benchmark.fitness.objective,
            descriptors=benchmark.fitness.descriptors,
            **cfg["archive"],
        )
        emitter = Emitter(
            archive=archive,
            benchmark=benchmark,
            operators=build_operators(cfg, store=store, benchmark=benchmark),
            **cfg.get("emitter", {}),
        )
        backend = make_backend(cfg, benchmark)
        log.info(
            "benchmark %s: %s is %s; %d evaluation slot(s); budget %d candidates",
            benchmark.name,
            benchmark.fitness.objective.name,
            benchmark.fitness.objective.direction.name.lower(),
            backend.slots,
            settings.max_candidates,
        )
        search = Search(
            store=store,
            archive=archive,
            emitter=emitter,
            backend=backend,
            benchmark=benchmark,
            settings=settings,
        )
        status = "interrupted"
        try:
            summary = asyncio.run(search.run())
            status = "finished"
        finally:
            backend.close()
            store.finish_run(run_id, status=status)
        (run_dir / "summary.json").write_text(json.dumps(summary.__dict__, indent=2))
        return summary
    finally:
        store.close()
