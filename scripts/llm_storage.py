"""How much of an archive the LLM calls take: archive and ``llm_calls`` bytes per 1k candidates.

Usage:
  python scripts/llm_storage.py --make 200 --out /tmp/run     # a circle-packing run through the
                                                              # scripted command model, then measure
  python scripts/llm_storage.py --archive /tmp/run            # measure an existing run
  python scripts/llm_storage.py --archive /tmp/run --migrate  # measure a migrated, vacuumed copy
Sizes are measured on a VACUUMed copy (free pages left out); ``llm_calls`` bytes come from
SQLite's dbstat table (its pages and its indexes' pages).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def make_run(candidates: int, out: Path, overrides: list[str], repo: Path = REPO) -> None:
    """A circle-packing run of ``candidates`` LLM candidates (scripted command model, 2 workers)
    made by the evolve of checkout ``repo`` (with its own ``.venv`` where it has one)."""
    command = f"{sys.executable} {REPO / 'tests' / 'fixtures' / 'scripted_model.py'} --seed 0"
    own = repo / ".venv" / "bin" / "python"
    args = [
        str(own) if own.exists() else sys.executable,
        "-m",
        "evolve",
        "llm=command",
        f"llm.command={command}",
        f"search.max_candidates={candidates}",
        "operators.builtin.tweak=0",
        "operators.builtin.crossover=0",
        "search.workers=2",
        "search.progress=false",
        f"hydra.run.dir={out}",
        *overrides,
    ]
    env = {**os.environ, "PYTHONPATH": str(repo), "HYDRA_FULL_ERROR": "1"}
    subprocess.run(args, check=True, cwd=repo, env=env, stdout=sys.stderr)


def measure(archive: Path, *, migrate: bool) -> str:
    """One line: archive and llm_calls bytes, in total and per 1k candidates."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "archive.db"
        source = sqlite3.connect(archive)
        target = sqlite3.connect(copy)
        source.backup(target)
        source.close()
        target.close()
        if migrate:
            from evolve.store.database import Store

            Store(copy).close()
        conn = sqlite3.connect(copy, isolation_level=None)
        conn.execute("VACUUM")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        candidates = conn.execute("SELECT COUNT(*) FROM candidates").fetchone()[0]
        calls = conn.execute("SELECT COUNT(*) FROM llm_calls").fetchone()[0]
        llm_bytes = conn.execute(
            "SELECT SUM(pgsize) FROM dbstat WHERE name='llm_calls' OR name IN "
            "(SELECT name FROM sqlite_master WHERE type='index' AND tbl_name='llm_calls')"
        ).fetchone()[0]
        conn.close()
        total = copy.stat().st_size
    per_k = 1000 / max(candidates, 1)
    return (
        f"schema {version}: {candidates} candidates, {calls} llm_calls; archive {total / 1e6:.2f} MB "
        f"({total * per_k / 1e6:.2f} MB per 1k candidates), llm_calls {llm_bytes / 1e6:.2f} MB "
        f"({llm_bytes * per_k / 1e6:.2f} MB per 1k, {100 * llm_bytes / total:.0f}% of the archive)"
    )


def main(argv: list[str] | None = None) -> int:
    """Make a run if asked, then print its measurements."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--make", type=int, help="make a run of this many candidates first")
    parser.add_argument("--out", type=Path, help="run directory for --make (must not exist)")
    parser.add_argument("overrides", nargs="*", help="further overrides for --make (key=value)")
    parser.add_argument("--archive", type=Path, help="a run directory or archive.db to measure")
    parser.add_argument(
        "--migrate", action="store_true", help="measure a copy opened (migrated) by this evolve"
    )
    args = parser.parse_args(argv)
    if args.make:
        if args.out is None or args.out.exists():
            print("--make needs --out naming a directory that does not exist", file=sys.stderr)
            return 2
        make_run(args.make, args.out, args.overrides)
    path = args.archive or args.out
    if path is None:
        print("give --archive RUN_DIR or --make N --out RUN_DIR", file=sys.stderr)
        return 2
    archive = path / "archive.db" if path.is_dir() else path
    print(measure(archive, migrate=args.migrate))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
