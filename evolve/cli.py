"""What ``python -m evolve`` does around a run: start checks, resume, and a readable ending.

A problem found before the run starts (the config, the hardware, a resume path) ends the
program with one message that names the fix and exit status 2, never a traceback.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shlex
import shutil
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from evolve.launch.config import (
    FitnessBuildError,
    alternatives,
    build_settings,
    compose,
    merge_resumed,
    new_run_dir,
    with_benchmark_search_defaults,
)
from evolve.settings import Alternative, ConfigError, RunSettings
from evolve.store import runlock
from evolve.store.database import Store
from evolve.types import EvolveError

if TYPE_CHECKING:
    from evolve.search.driver import Summary

log = logging.getLogger("evolve")

START_ERROR = 2  # exit status of a run that could not start (the message says why)


class HardwareError(ConfigError):
    """The benchmark needs more GPUs than this machine shows; the message names what works here."""


def fail_to_start(message: str) -> NoReturn:
    """Print ``error: message`` to stderr and exit with status 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(START_ERROR)


def discard_start(run_dir: Path, cfg: dict[str, Any], *, archive: bool = False) -> None:
    """Remove what a run that did not start wrote, then the folders it leaves empty (up to the cwd).

    That is Hydra's ``.hydra/`` and the log, and with ``archive`` the archive a new run made
    before it found it could not go on (a new run refuses a directory whose archive holds a
    run, so it held none). A resumed run's directory is left as it is.
    """
    if cfg.get("resume"):
        return
    made = [".hydra", "evolve.log"]
    if archive:
        made += [".lock", "archive.db", "archive.db-wal", "archive.db-shm", "archive.db-journal"]
    elif (run_dir / "archive.db").exists():
        return
    for name in made:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    folder, here = run_dir.resolve(), Path.cwd().resolve()
    while folder.is_dir() and not any(folder.iterdir()):  # archives/<benchmark>/ too, if emptied
        folder.rmdir()
        folder = folder.parent
        if folder == here or not folder.is_relative_to(here):
            break


def check_start_arguments(argv: list[str]) -> None:
    """Fail before Hydra creates or rewrites anything: ``resume=`` that names no run directory,
    or a run directory (``resume=`` or ``hydra.run.dir=``) that a live run holds (Hydra would
    rewrite that run's ``.hydra/`` before evolve could refuse the start)."""
    for arg in argv:
        key, _, value = arg.partition("=")
        if key not in ("resume", "hydra.run.dir") or value in ("", "null"):
            continue
        path = Path(value).expanduser()
        if key == "resume" and not (path / "archive.db").is_file():
            fail_to_start(
                f"resume={path}: no archive.db there. Pass a run directory made by an earlier run, "
                "e.g. resume=archives/circle_packing/2026-11-29_10-00-00"
            )
        try:
            runlock.check_free(path)
        except runlock.RunDirectoryBusy as exc:
            fail_to_start(str(exc))


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a full disk: SQLite's "database or disk is full" or ENOSPC."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(exc, sqlite3.OperationalError) and "disk is full" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def visible_gpus() -> tuple[int, str]:
    """How many GPUs evaluations could use here, and how that was found (for messages)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    from evolve.harness.gpus import visible_gpus as gpus  # imports torch when nothing is listed

    found = len(gpus())
    if listed is not None:
        return found, f"CUDA_VISIBLE_DEVICES={listed!r}"
    return found, f"torch sees {found} CUDA device(s)"


def _key(override: str) -> str:
    return override.lstrip("+~").partition("=")[0]


def command_for(alternative: Alternative, overrides: Sequence[str]) -> str:
    """The command line of ``alternative``: its arguments plus the user's others that still apply.

    An alternative that names another benchmark (``benchmark=...``) drops the user's
    ``benchmark.*`` overrides, which were meant for the one asked for.
    """
    choice = [a for a in alternative.args if _key(a) == "benchmark"]
    extra = [a for a in alternative.args if _key(a) != "benchmark"]
    taken = {_key(a) for a in extra}
    kept = [
        o
        for o in overrides
        if _key(o) not in taken and not (choice and _key(o).startswith("benchmark"))
    ]
    first = choice or [o for o in kept if _key(o) == "benchmark"]
    rest = [o for o in kept if _key(o) != "benchmark"]
    return shlex.join(["python", "-m", "evolve", *first, *extra, *rest])


def check_gpus(
    benchmark: str,
    needed: int,
    offered: Sequence[Alternative],
    overrides: Sequence[str],
    *,
    found: tuple[int, str] | None = None,
) -> None:
    """Refuse a benchmark that needs more GPUs per evaluation than are visible, offering what fits.

    Args:
        benchmark: its name, for the message.
        needed: GPUs one evaluation needs.
        offered: the benchmark config's ``alternatives:``, best first.
        overrides: the command line's overrides (kept in the commands offered).
        found: (GPUs visible, how that was found); by default it is looked up.

    Raises:
        HardwareError: the message says what was found and the exact commands that work here.
    """
    if needed <= 0:
        return
    count, how = found if found is not None else visible_gpus()
    if count >= needed:
        return
    seen = (
        "none is visible" if count == 0 else f"only {count} {'is' if count == 1 else 'are'} visible"
    )
    head = f"benchmark {benchmark} needs {needed} GPU(s) per evaluation, but {seen} here ({how})."
    fitting = [a for a in offered if a.gpus <= count]
    if not fitting:
        raise HardwareError(
            f"{head} It has no smaller scale: run it on a machine with {needed} CUDA GPU(s) "
            "(nvidia-smi lists them; CUDA_VISIBLE_DEVICES must not hide them)"
        )
    lines = [f"  {command_for(a, overrides)}\n      {a.why}" for a in fitting]
    raise HardwareError(f"{head} What works here, best first:\n" + "\n".join(lines))


def checked_settings(cfg: dict[str, Any], overrides: Sequence[str]) -> RunSettings:
    """The run's typed settings, refused with the benchmark's alternatives where its GPUs are missing.

    Only the local backend is checked (a Ray cluster's GPUs are its own). A fitness that
    fails to build on a machine short of the GPUs its config names (a GPU-only benchmark
    checks for CUDA itself) is reported as that shortage.

    Raises:
        ConfigError: the message names the fix.
    """
    node = cfg["benchmark"]
    local = (cfg.get("backend") or {}).get("name", "local") == "local"
    try:
        settings = build_settings(cfg)
    except FitnessBuildError:
        if local:
            check_gpus(
                node.get("name", "?"),
                int(node.get("gpus") or 0),
                alternatives(node.get("alternatives")),
                overrides,
            )
        raise
    if local:
        check_gpus(
            settings.benchmark.name, settings.benchmark.gpus, settings.alternatives, overrides
        )
    return settings


def start(cfg: dict[str, Any], run_dir: Path, overrides: Sequence[str]) -> tuple[RunSettings, bool]:
    """The settings of the run to start (a resumed run's from its stored config) and whether it resumes.

    Raises:
        EvolveError: the run cannot start; the message names the fix.
    """
    resumed = bool(cfg.get("resume"))
    if resumed:
        store = Store(run_dir / "archive.db")
        try:
            latest = store.latest_run()
        finally:
            store.close()
        if latest is None:
            raise ConfigError(
                f"{run_dir}/archive.db holds no run yet; start a new run instead of resuming"
            )
        cfg = merge_resumed(json.loads(latest["config"]), overrides)
    else:
        cfg = with_benchmark_search_defaults(cfg, overrides)
    return checked_settings(cfg, overrides), resumed


def run(overrides: Sequence[str] = (), *, run_dir: Path | str | None = None) -> Summary:
    """Run a search from Python, as ``python -m evolve OVERRIDES`` would; returns how it ended.

    Args:
        overrides: Hydra overrides, e.g. ``["search.max_candidates=50", "archive.islands=4"]``.
        run_dir: where the run is written (default ``archives/<benchmark>/<time>``, or the
            ``resume=`` directory).

    Raises:
        EvolveError: the run cannot start or stopped on an error; the message names the fix.
    """
    from evolve.launch import runner

    cfg = compose(overrides)
    where = Path(run_dir or new_run_dir(cfg.get("resume"), cfg["benchmark"]["name"]))
    settings, resumed = start(cfg, where, overrides)
    if settings.dry_run:
        raise ConfigError("dry_run=true only checks a config; leave it out to run from Python")
    return runner.run(settings, where, resumed=resumed)


def report(cfg: dict[str, Any], run_dir: Path, overrides: list[str]) -> Summary | None:
    """Run (or resume) and print how it ended (None for a dry run); user errors exit with one line."""
    try:
        settings, resumed = start(cfg, run_dir, overrides)
    except EvolveError as exc:
        discard_start(run_dir, cfg)
        fail_to_start(str(exc))
    if settings.dry_run:
        discard_start(run_dir, cfg)
        print(
            f"dry run: the config is valid and benchmark {settings.benchmark.name} can start here "
            f"(budget {settings.search.max_candidates} candidates); leave out dry_run=true to start"
        )
        return None
    from evolve.launch import runner  # the loop, the operators and the model client load only now
    from evolve.llm import LLMConfigError, PreflightError

    try:
        summary = runner.run(settings, run_dir, resumed=resumed)
    except (
        ConfigError,
        LLMConfigError,
        PreflightError,
    ) as exc:  # found before anything was evaluated
        discard_start(run_dir, cfg, archive=not resumed)
        fail_to_start(str(exc))
    except EvolveError as exc:  # once, on stderr (a log line as well printed it twice)
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
        f"seed {number(summary.seed_fitness)}  ->  best {number(summary.best)} ({summary.best_id})\n"
        f"run directory: {run_dir}\nbrowse it: python -m evolve.browse {run_dir} best"
    )
    budget = settings.search.max_candidates
    if summary.reason.startswith(f"reached search.max_candidates={budget}"):
        print(
            f"go on with a larger budget: python -m evolve resume={run_dir} "
            f"search.max_candidates={2 * budget}"
        )
    if summary.reason.startswith(runner.STOPPED):
        sys.exit(128 + 15)
    return summary


def number(value: float | None) -> str:
    """A fitness for the final lines: six significant digits, ``-`` when there is none."""
    return "-" if value is None else f"{value:.6g}"


def sweep_overview(jobs: Sequence[tuple[Sequence[str], Path, Summary]]) -> str:
    """The lines a ``-m`` sweep ends with: each run's overrides, seed and best, and its directory."""
    lines = [f"sweep of {len(jobs)} run(s):"]
    lines += [
        f"  {' '.join(overrides) or '(defaults)'}: seed {number(summary.seed_fitness)} -> best "
        f"{number(summary.best)} ({summary.reason}); {run_dir}"
        for overrides, run_dir, summary in jobs
    ]
    return "\n".join(lines)
