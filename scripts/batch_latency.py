"""How long a training program waits for each real batch of the harness's stream.

The harness makes the next real batch while the program trains on the last one
(``evolve.harness.clock``), so a request waits only for the pipe, not for the feed's
packing. This runs a program that asks for ``--rows`` rows of the nanochat GPU scale's width
(2,049 tokens) a step and then sleeps ``--step`` seconds (a GPU step's CPU side, waiting),
under ``run_timed`` with the nanochat feed (best-fit packing from a prepared dataset); it
prints the program's wait per real batch and, timed in the same run, what making one such
batch costs the feed (what each request would wait for on top if it were made on request)::

    python -m evolve.benchmarks.nanochat.gpu_run --device cpu --tiny --prepare-only --data-dir /tmp/nc
    python scripts/batch_latency.py /tmp/nc/wikipedia-tiny --rows 64 --step 0.05 --budget 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from evolve.benchmarks.nanochat import prepare
from evolve.benchmarks.nanochat.supervisor import Rows

from evolve.harness.clock import Window, launch, run_timed

PROGRAM = """
import json, time
from evolve.harness.stream import EndOfData, channel
c, waits = channel(), []
while True:
    asked = time.perf_counter()
    try:
        c.batch({rows})
    except EndOfData:
        break
    waits.append(time.perf_counter() - asked)
    time.sleep({step})
    if not c.step(tokens=1):
        break
print("WAITS", json.dumps(waits[{untimed}:]), flush=True)
c.saved()
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dataset", type=Path, help="a prepared nanochat dataset folder")
    parser.add_argument(
        "--rows", type=int, default=64, help="rows per batch (the GPU seed's micro-batch)"
    )
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument(
        "--step", type=float, default=0.05, help="seconds the program spends per step"
    )
    parser.add_argument("--budget", type=float, default=5.0, help="timed seconds")
    args = parser.parse_args()
    meta = json.loads((args.dataset / "dataset.json").read_text())
    job = {"seq_len": args.seq_len, "vocab_size": meta["vocab_size"], "bos_id": meta["bos_id"], "seed": 0,
           "train_dir": str(prepare.split_dirs(args.dataset)["train"])}  # fmt: skip
    untimed = 3
    with tempfile.TemporaryDirectory() as tmp:
        program = Path(tmp) / "program.py"
        program.write_text(PROGRAM.format(rows=args.rows, step=args.step, untimed=untimed))
        window = Window(budget_s=args.budget, untimed_steps=untimed, startup_limit_s=60.0,
                        free_startup_s=60.0, finish_limit_s=30.0, save_limit_s=10.0)  # fmt: skip
        program_run = launch([sys.executable, str(program)], env=dict(os.environ),
                             log_file=str(Path(tmp) / "log"), marker_var="BATCH_LATENCY_TREE")  # fmt: skip
        verdict = run_timed(program_run, window=window, feed=Rows(job))
        log = (Path(tmp) / "log").read_text()
    if verdict["status"] != "ok" or "WAITS " not in log:
        raise SystemExit(
            f"the program failed: {verdict['status']} {verdict.get('reason')}\n{log[-2000:]}"
        )
    waits = json.loads(log.split("WAITS ")[1].splitlines()[0])
    feed, made = Rows(job), []
    for _ in range(30):
        begin = time.perf_counter()
        feed(args.rows, True)
        made.append(time.perf_counter() - begin)
    ms = 1e3
    print(f"{len(waits)} real batches of {args.rows} x {args.seq_len + 1} tokens: the program waited "
          f"{statistics.fmean(waits) * ms:.3f} ms on average (median {statistics.median(waits) * ms:.3f} ms); "
          f"making one such batch costs the feed {statistics.fmean(made) * ms:.3f} ms "
          f"(median {statistics.median(made) * ms:.3f} ms)")  # fmt: skip


if __name__ == "__main__":
    main()
