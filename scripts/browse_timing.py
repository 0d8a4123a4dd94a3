"""Time every browse CLI command and every web page on a large archive (goal: each under 1 s).

Usage:
    python scripts/browse_timing.py --archive /tmp/big/archive.db      # an existing archive
    python scripts/browse_timing.py --candidates 100000                # build one first (~20 s)

CLI figures are wall-clock times of ``python -m evolve.browse ...`` subprocesses, Python
start-up included. Page figures are the time to fetch each page over HTTP from a running
``serve``, and (when Debian's chromium and playwright are installed) the browser's time
from navigation start to the load event. Each is the median of --repeat runs, after one
warm-up run; the worst run is shown too.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CHROMIUM = os.environ.get("EVOLVE_CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _pick_ids(archive: Path) -> dict[str, str]:
    conn = sqlite3.connect(f"file:{archive}?mode=ro", uri=True)
    rng = random.Random(0)
    count = conn.execute("SELECT MAX(seq) FROM candidates").fetchone()[0]
    pick = {}
    for label, status in (("done", "done"), ("failed", "failed")):
        for _ in range(100):
            row = conn.execute(
                "SELECT id, status FROM candidates WHERE seq=?", (rng.randint(1, count),)
            ).fetchone()
            if row[1] == status:
                pick[label] = row[0][:8]
                break
    conn.close()
    return pick


def _process_cpu(pid: int) -> float:
    """User + system CPU seconds a running process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _time(fn, repeat: int) -> tuple[float, float, float]:
    """Median and worst wall time, and median CPU time of child processes (user + system)."""
    fn()  # warm-up (page cache, first connection)
    runs, cpus = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(runs), max(runs), statistics.median(cpus)


def time_cli(archive: Path, ids: dict[str, str], repeat: int, scratch: Path) -> list[dict]:
    """Median and worst wall time of each CLI command."""
    commands = [
        [],
        ["best"],
        ["best", "--json"],
        ["show", "best"],
        ["show", ids["done"]],
        ["show", ids["failed"], "--json"],
        ["diff", "best"],
        ["diff", ids["done"], "best"],
        ["lineage", "best"],
        ["lineage", "best", "--format", "dot"],
        ["lineage", ids["done"], "--format", "json"],
        ["cells"],
        ["cells", "--json"],
        ["stats"],
        ["stats", "--json"],
        ["export", "best", str(scratch / "export"), "--force"],
        ["plot", "--out", str(scratch / "plots")],
    ]
    rows = []
    for args in commands:

        def run(args=args) -> None:
            subprocess.run(
                [sys.executable, "-m", "evolve.browse", str(archive), *args],
                check=True,
                stdout=subprocess.DEVNULL,
                env={**os.environ, "COLUMNS": "160"},
            )

        median, worst, cpu = _time(run, repeat)
        what = "cli " + (" ".join(args) or "(summary)")
        rows.append({"what": what, "median_s": median, "max_s": worst, "cpu_s": cpu})
        print(f"  {what}: {median:.3f} s (cpu {cpu:.3f} s)", file=sys.stderr, flush=True)
    return rows


def time_pages(archive: Path, ids: dict[str, str], repeat: int) -> list[dict]:
    """Median and worst time of each page: HTTP fetch, and browser load when Chromium is available."""
    server = subprocess.Popen(
        [sys.executable, "-m", "evolve.browse", str(archive), "serve", "--port", "0", "--json"],
        stdout=subprocess.PIPE,
        text=True,
    )
    base = json.loads(server.stdout.readline())["url"].rsplit("/-/evolve", 1)[0]
    pages = [
        "/-/evolve",
        "/-/evolve?island=1",
        "/-/evolve/elites",
        "/-/evolve/elites?sort=seq&order=asc&island=0",
        "/-/evolve/c/best",
        f"/-/evolve/c/{ids['done']}",
        f"/-/evolve/c/{ids['failed']}",
        "/-/evolve/lineage",
        f"/-/evolve/lineage/{ids['done']}?inspirations=1",
        "/-/evolve/version.json",
        "/archive/candidates?_size=20",
    ]
    rows = []
    try:
        for page in pages:

            def fetch(page=page) -> None:
                with urllib.request.urlopen(base + page, timeout=30) as response:
                    response.read()

            cpu_before = _process_cpu(server.pid)
            median, worst, _ = _time(fetch, repeat)
            cpu = (_process_cpu(server.pid) - cpu_before) / (
                repeat + 1
            )  # the server's own CPU per request
            rows.append({"what": "http " + page, "median_s": median, "max_s": worst, "cpu_s": cpu})
            print(
                f"  http {page}: {median:.3f} s (server cpu {cpu:.3f} s)",
                file=sys.stderr,
                flush=True,
            )
        rows += _browser_times(base, pages, repeat)
    finally:
        server.terminate()
        server.wait(timeout=10)
    return rows


def _browser_times(base: str, pages: list[str], repeat: int) -> list[dict]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return []
    if not Path(CHROMIUM).exists():
        return []
    rows = []
    with sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=FLAGS
        )
        tab = context.new_page()
        for page in pages:
            if page.endswith(".json"):
                continue
            times = []
            for attempt in range(repeat + 1):
                tab.goto(base + page, wait_until="load")
                elapsed = tab.evaluate(
                    "performance.getEntriesByType('navigation')[0].loadEventEnd / 1000"
                )
                if attempt:
                    times.append(elapsed)
            rows.append(
                {
                    "what": "browser " + page,
                    "median_s": statistics.median(times),
                    "max_s": max(times),
                }
            )
        context.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    """Build or open the archive, time everything, print a table, write JSON with --json-out."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archive", type=Path, help="an existing archive.db")
    parser.add_argument(
        "--candidates",
        type=int,
        default=100_000,
        help="size of the archive built when no --archive",
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json-out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        archive = args.archive
        if archive is None:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ is not installed
            from tests.fixtures.sample_archive import write_sample_archive

            archive = write_sample_archive(
                scratch / "run" / "archive.db", candidates=args.candidates, islands=4
            )
        candidates = (
            sqlite3.connect(f"file:{archive}?mode=ro", uri=True)
            .execute("SELECT COUNT(*) FROM candidates")
            .fetchone()[0]
        )
        size_mb = archive.stat().st_size / 1e6
        ids = _pick_ids(archive)
        rows = time_cli(archive, ids, args.repeat, scratch) + time_pages(archive, ids, args.repeat)
    width = max(len(r["what"]) for r in rows)
    load = os.getloadavg()
    print(
        f"archive: {archive} ({candidates} candidates, {size_mb:.0f} MB); {os.cpu_count()} CPUs, "
        f"load average {load[0]:.1f} (wall times grow with load; CPU times much less)"
    )
    print(f"{'what':<{width}}  wall_median_s  wall_max_s  cpu_s")
    for row in rows:
        flag = "" if row["max_s"] < 1.0 else "  wall over 1 s"
        cpu = f"{row['cpu_s']:5.3f}" if "cpu_s" in row else "    -"
        print(f"{row['what']:<{width}}  {row['median_s']:13.3f}  {row['max_s']:10.3f}  {cpu}{flag}")
    if args.json_out:
        args.json_out.write_text(
            json.dumps(
                {"archive": str(archive), "candidates": candidates, "load": load, "rows": rows},
                indent=2,
            )
        )
    return 0 if all(r["max_s"] < 1.0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
