"""Write a synthetic archive (default 100k candidates) through the real Store API, for browse timing.

Usage: python scripts/make_big_archive.py --out /tmp/big/archive.db [--candidates 100000] [--islands 4]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the sample archive is a test fixture (tests/fixtures)

from evolve.store.database import Store  # noqa: E402
from tests.fixtures.sample_archive import write_sample_archive  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, write the archive, print its size and integrity."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, required=True, help="archive file to create (must not exist)"
    )
    parser.add_argument("--candidates", type=int, default=100_000)
    parser.add_argument("--islands", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.out.exists():
        print(f"{args.out} exists: remove it or choose another --out", file=sys.stderr)
        return 2
    start = time.perf_counter()
    write_sample_archive(args.out, candidates=args.candidates, islands=args.islands, seed=args.seed)
    seconds = time.perf_counter() - start
    store = Store(args.out, readonly=True)
    problems = store.integrity_problems()
    counts = {
        name: store.conn.execute(f"SELECT COUNT(*) FROM {name}").fetchone()[0]
        for name in ("candidates", "evaluations", "edges", "elites", "llm_calls", "stats")
    }
    store.close()
    size_mb = args.out.stat().st_size / 1e6
    print(
        f"wrote {args.out} in {seconds:.1f} s: {size_mb:.0f} MB, "
        + ", ".join(f"{v} {k}" for k, v in counts.items())
        + f"; integrity: {'ok' if not problems else problems[:3]}"
    )
    return 0 if not problems else 1


if __name__ == "__main__":
    raise SystemExit(main())
