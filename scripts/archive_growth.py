"""Archive size per 1,000 candidates of a long toy run, for this checkout and a baseline one.

Usage:
  python scripts/archive_growth.py --baseline /tmp/main-checkout [--candidates 2500] [--llm]

Each checkout runs the toy benchmark (built-in operators, 2 workers; ``--llm``: the scripted
command model instead, so prompts and the research notebook are stored too) in sessions ending at
1,000, 2,000, ... candidates (each a resume of the last), measured after each; its own
evolve is imported (PYTHONPATH=checkout). Sizes are of a VACUUMed copy (free pages left
out), with the share of the largest tables (SQLite's dbstat).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


SCRIPTED_LLM = [
    "llm=command",
    f"llm.command={sys.executable} {REPO / 'tests' / 'fixtures' / 'scripted_model.py'} --seed 0",
    "operators.builtin.tweak=0",
    "operators.builtin.crossover=0",
]


def session(repo: Path, run_dir: Path, candidates: int, overrides: list[str]) -> float:
    """Start or resume the toy run in ``run_dir`` up to ``candidates``; its wall time."""
    where = f"resume={run_dir}" if (run_dir / "archive.db").exists() else f"hydra.run.dir={run_dir}"
    args = [
        sys.executable,
        "-m",
        "evolve",
        "--config-dir",
        str(REPO / "tests" / "fixtures" / "evolve_configs"),
        "benchmark=toy",
        f"search.max_candidates={candidates}",
        "search.workers=2",
        "search.progress=false",
        *([] if (run_dir / "archive.db").exists() else overrides),
        where,
    ]
    env = {**os.environ, "PYTHONPATH": f"{repo}:{REPO}", "HYDRA_FULL_ERROR": "1"}
    start = time.monotonic()
    subprocess.run(args, check=True, cwd=repo, env=env, stdout=subprocess.DEVNULL)
    return time.monotonic() - start


def measure(archive: Path) -> str:
    """Candidates, bytes per 1k candidates, the three largest tables' shares and the notebook's."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "archive.db"
        source, target = sqlite3.connect(archive), sqlite3.connect(copy)
        source.backup(target)
        source.close()
        target.close()
        conn = sqlite3.connect(copy, isolation_level=None)
        conn.execute("VACUUM")
        candidates = conn.execute("SELECT COUNT(*) FROM candidates").fetchone()[0]
        tables = conn.execute(
            "SELECT name, SUM(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC LIMIT 3"
        ).fetchall()
        (notebook,) = conn.execute(
            "SELECT COALESCE(SUM(pgsize), 0) FROM dbstat WHERE name='notebook' OR name IN "
            "(SELECT name FROM sqlite_master WHERE type='index' AND tbl_name='notebook')"
        ).fetchone()
        conn.close()
        total = copy.stat().st_size
    shares = ", ".join(f"{name} {100 * size / total:.0f}%" for name, size in tables)
    shares += f"; notebook {notebook / 1e6:.3f} MB, {100 * notebook / total:.0f}%"
    return f"{candidates} candidates: {total / 1e6:.2f} MB, {total * 1000 / candidates / 1e6:.3f} MB per 1k ({shares})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout of the baseline")
    parser.add_argument("--candidates", type=int, default=2500)
    parser.add_argument("--llm", action="store_true", help="the scripted model proposes")
    args = parser.parse_args(argv)
    stops = [*range(1000, args.candidates, 1000), args.candidates]
    for label, repo in (("baseline", args.baseline), ("this checkout", REPO)):
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = Path(tmp) / "run"
            for stop in stops:
                wall = session(repo, run_dir, stop, SCRIPTED_LLM if args.llm else [])
                print(
                    f"{label}: {measure(run_dir / 'archive.db')}; session {wall:.0f} s", flush=True
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
