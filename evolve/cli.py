"""What ``python -m evolve`` does around a run: argument checks, resume, and a readable ending."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from evolve.config import merge_resumed, with_benchmark_search_defaults
from evolve.store import Store
from evolve.types import EvolveError

log = logging.getLogger("evolve")


def check_resume_argument(argv: list[str]) -> None:
    """Fail before Hydra creates anything when ``resume=`` names no run directory."""
    for arg in argv:
        if arg.startswith("resume=") and arg != "resume=null":
            path = Path(arg.split("=", 1)[1]).expanduser()
            if not (path / "archive.db").is_file():
                sys.exit(
                    f"error: resume={path}: no archive.db there. Pass a run directory made by an earlier run, "
                    "e.g. resume=archives/circle_packing/2026-11-29_10-00-00"
                )


def report(cfg: dict[str, Any], run_dir: Path, overrides: list[str]) -> None:
    """Run (or resume) and print how it ended; user errors exit with a one-line message."""
    from evolve import runner

    try:
        resumed = bool(cfg.get("resume"))
        if resumed:
            store = Store(run_dir / "archive.db")
            try:
                latest = store.latest_run()
            finally:
                store.close()
            if latest is None:
                raise EvolveError(
                    f"{run_dir}/archive.db holds no run yet; start a new run instead of resuming"
                )
            cfg = merge_resumed(json.loads(latest["config"]), overrides)
        else:
            cfg = with_benchmark_search_defaults(cfg, overrides)
        summary = runner.run(cfg, run_dir, resumed=resumed)
    except EvolveError as exc:
        log.error("%s", exc)
        sys.exit(f"error: {exc}")
    except KeyboardInterrupt:
        sys.exit(f"\ninterrupted; the archive is consistent. Continue with: python -m evolve resume={run_dir}")
    print(
        f"\nrun finished ({summary.reason}): {summary.evaluated} evaluated, {summary.failures} failed\n"
        f"seed {summary.seed_fitness}  ->  best {summary.best} ({summary.best_id})\n"
        f"run directory: {run_dir}\nbrowse it: python -m evolve.browse {run_dir} best"
    )
