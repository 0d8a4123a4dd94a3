"""What ``python -m evolve`` does around a run: argument checks, resume, and a readable ending."""

from __future__ import annotations

import errno
import json
import logging
import sqlite3
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


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a full disk: SQLite's "database or disk is full" or ENOSPC."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(exc, sqlite3.OperationalError) and "disk is full" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


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
        sys.exit(
            f"\ninterrupted; the archive is consistent. Continue with: python -m evolve resume={run_dir}"
        )
    except (sqlite3.OperationalError, OSError) as exc:
        if not disk_full(exc):
            raise
        log.error("disk full: %s", exc)
        sys.exit(
            f"error: the disk holding {run_dir} is full ({exc}); the archive is consistent up to the "
            f"last finished step. Free some space, then continue with: python -m evolve resume={run_dir}"
        )
    print(
        f"\nrun finished ({summary.reason}): {summary.evaluated} evaluated, {summary.failures} failed\n"
        f"seed {summary.seed_fitness}  ->  best {summary.best} ({summary.best_id})\n"
        f"run directory: {run_dir}\nbrowse it: python -m evolve.browse {run_dir} best"
    )
    if summary.reason.startswith(runner.STOPPED):
        sys.exit(128 + 15)
