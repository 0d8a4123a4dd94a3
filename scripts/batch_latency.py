"""How long a training program waits for each real batch of the harness's stream.

The harness makes up to a step's worth of real rows ahead in a quiet moment while the program
trains, and the stream, told the untimed steps, asks for the next step's batches once a step
has taken as many as the last one (``evolve.harness.clock``), so a request waits only for the
pipe, if at all. This runs a
program that takes ``--per-step`` batches of ``--rows`` rows of the nanochat GPU scale's
width (2,049 tokens) back to back at each step's start (as the GPU seed does with its
micro-batches) and then sleeps ``--step`` seconds (the GPU working), under ``run_timed`` with
the nanochat feed (best-fit packing from a prepared dataset), once with the stream asking
when it needs a batch and once asking ahead; it prints the program's wait per real batch in
each (also by the batch's place in its step), their ratio, and what making one batch costs the
feed::

    python -m evolve.benchmarks.nanochat.gpu_run --device cpu --tiny --prepare-only --data-dir /tmp/nc
    python scripts/batch_latency.py /tmp/nc/wikipedia-tiny --rows 64 --per-step 4 --step 0.05 --budget 5
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

from evolve.harness.clock import UNTIMED_ENV, Window, launch, run_timed

PROGRAM = """
import json, time
from evolve.harness.stream import EndOfData, channel
c, waits = channel(), []
try:
    while True:
        for _ in range({per_step}):
            asked = time.perf_counter()
            c.batch({rows})
            waits.append(time.perf_counter() - asked)
        time.sleep({step})
        if not c.step(tokens=1):
            break
except EndOfData:
    pass
print("WAITS", json.dumps(waits[{untimed} * {per_step}:]), flush=True)
c.saved()
"""


def waits_per_batch(args: argparse.Namespace, job: dict, *, ask_ahead: bool) -> list[float]:
    """The program's wait for each real batch under ``run_timed``; ``ask_ahead``: the stream is
    told the untimed steps (``UNTIMED_ENV``), as the nanochat supervisor tells it, and asks for
    the next step's batches while a step trains."""
    untimed = 3
    env = {k: v for k, v in os.environ.items() if k != UNTIMED_ENV}
    if ask_ahead:
        env[UNTIMED_ENV] = str(untimed)
    with tempfile.TemporaryDirectory() as tmp:
        program = Path(tmp) / "program.py"
        program.write_text(PROGRAM.format(rows=args.rows, step=args.step, untimed=untimed,
                                          per_step=args.per_step))  # fmt: skip
        window = Window(budget_s=args.budget, untimed_steps=untimed, startup_limit_s=60.0,
                        free_startup_s=60.0, finish_limit_s=30.0, save_floor_s=0.5)  # fmt: skip
        program_run = launch([sys.executable, str(program)], env=env,
                             log_file=str(Path(tmp) / "log"), marker_var="BATCH_LATENCY_TREE")  # fmt: skip
        verdict = run_timed(program_run, window=window, feed=Rows(job))
        log = (Path(tmp) / "log").read_text()
    if verdict["status"] != "ok" or "WAITS " not in log:
        raise SystemExit(
            f"the program failed: {verdict['status']} {verdict.get('reason')}\n{log[-2000:]}"
        )
    return json.loads(log.split("WAITS ")[1].splitlines()[0])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dataset", type=Path, help="a prepared nanochat dataset folder")
    parser.add_argument(
        "--rows", type=int, default=64, help="rows per batch (the GPU seed's micro-batch)"
    )
    parser.add_argument(
        "--per-step", type=int, default=4, help="batches taken back to back at each step's start"
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
    ms = 1e3
    means = {}
    for ask_ahead in (False, True):
        waits = waits_per_batch(args, job, ask_ahead=ask_ahead)
        means[ask_ahead] = statistics.fmean(waits)
        print(f"{'asked ahead' if ask_ahead else 'asked when needed'}: {len(waits)} real batches of "
              f"{args.rows} x {args.seq_len + 1} tokens, the program waited {means[ask_ahead] * ms:.3f} ms "
              f"on average (median {statistics.median(waits) * ms:.3f} ms)")  # fmt: skip
        places = [statistics.fmean(waits[i :: args.per_step]) * ms for i in range(args.per_step)]
        print("  by the batch's place in its step: " + ", ".join(f"{w:.3f}" for w in places) + " ms")
    print(f"asked ahead / asked when needed: {means[True] / means[False]:.2f} of the wait")
    feed, made = Rows(job), []
    for _ in range(30):
        begin = time.perf_counter()
        feed(args.rows, True)
        made.append(time.perf_counter() - begin)
    print(f"making one such batch costs the feed {statistics.fmean(made) * ms:.3f} ms "
          f"(median {statistics.median(made) * ms:.3f} ms)")  # fmt: skip


if __name__ == "__main__":
    main()
