"""What issue 29's host isolation costs: giving a workdir to an evaluation's uid, and dropping the
page cache before a strict re-evaluation (with what the next evaluation then pays to start).

    python scripts/isolation_cost.py [--repeat 20] [--import numpy]

Run as root (else the uid is not switched and the page cache not dropped: it says so). The
cache drop is every file's: other work on the machine reads its files from disk again.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evolve.sandbox import identity, pagecache
from evolve.sandbox.process import isolation_report, run

SEED = Path(__file__).resolve().parents[1] / "benchmarks" / "circle_packing" / "seed"


def timed(fn, *args, **kwargs) -> float:
    begin = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - begin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--import", dest="module", default="numpy")
    args = parser.parse_args()
    print("uid:", isolation_report()["uid"])
    grants, runs = [], []
    for _ in range(args.repeat):
        work = Path(tempfile.mkdtemp(prefix="evolve-cost-"))
        try:
            shutil.copytree(SEED, work, dirs_exist_ok=True)
            grants.append(timed(identity.grant, identity.current(), [str(work)], [str(work)]))
            runs.append(timed(run, ["true"], cwd=work))
        finally:
            shutil.rmtree(work)
    print(
        f"grant (chown the seed's workdir, reach the interpreter): median "
        f"{statistics.median(grants) * 1e3:.2f} ms; a whole sandboxed `true` (grant included): "
        f"median {statistics.median(runs) * 1e3:.1f} ms, {args.repeat} runs"
    )
    start = [sys.executable, "-c", f"import {args.module}"]
    warm = min(timed(subprocess.run, start, check=True) for _ in range(2))
    begin = time.perf_counter()
    said = pagecache.forget()
    dropped = time.perf_counter() - begin
    cold = timed(subprocess.run, start, check=True)
    print(f"forget(): {dropped:.2f} s ({said})")
    print(
        f"`python -c 'import {args.module}'`: warm {warm:.2f} s, right after forget() {cold:.2f} s"
    )


if __name__ == "__main__":
    main()
