"""A short search with ``backend=ray`` on this machine's GPUs, with one Ray worker killed mid-run.

Runs ``python -m evolve --config-dir tests/backends/evolve_configs benchmark=gpu_probe
backend=ray ...``: each evaluation is a Ray task with ``num_gpus=1`` that does a bf16 matmul
on its GPU and checks that CUDA_VISIBLE_DEVICES, ``ray.get_gpu_ids()`` and the sandboxed
candidate process agree. Once the third evaluation starts, the Ray worker running it is
killed (SIGKILL); the backend must run that candidate again and record it once. Then it
checks the archive and prints a table; everything lands in $OUT (or --out).

    python scripts/ray_gpu_run.py                   # all GPUs of this machine, 12 candidates
    python scripts/ray_gpu_run.py --gpus 0,1        # only these GPUs (CUDA_VISIBLE_DEVICES)
    python scripts/ray_gpu_run.py --smoke           # 4 candidates, small matmul
    python scripts/ray_gpu_run.py --cpu --smoke     # no GPU: Ray is told of a fake one, torch uses CPU

Exit status 0 when every check passed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evolve.store.database import Store  # noqa: E402
from tests.backends.fitnesses import traces  # noqa: E402


def start_search(args: argparse.Namespace, out: Path, env: dict[str, str]) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "evolve", "--config-dir", "tests/backends/evolve_configs",
        "benchmark=gpu_probe", "backend=ray", f"backend.address={args.address}",
        f"search.max_candidates={args.candidates}", "search.progress=false",
        f"hydra.run.dir={out / 'run'}", f"benchmark.fitness.trace_dir={out / 'traces'}",
        f"benchmark.fitness.sleep_s={args.sleep}", f"benchmark.fitness.size={args.size}",
    ]  # fmt: skip
    if args.cpu:
        command += [f"backend.local_gpus={args.cpu_gpus}", "benchmark.fitness.require_gpu=false"]
    print("$", " ".join(command), flush=True)
    log = open(out / "evolve.out", "w")  # noqa: SIM115 - the child holds it until it exits
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def kill_third_worker(search: subprocess.Popen, trace_dir: Path, timeout_s: float) -> dict | None:
    """SIGKILL the Ray worker of the third evaluation run; returns its trace."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and search.poll() is None:
        runs = [t for t in traces(trace_dir) if not t["candidate"].endswith("-child")]
        if len(runs) >= 3:
            os.kill(runs[2]["pid"], signal.SIGKILL)
            print(f"killed Ray worker pid {runs[2]['pid']} evaluating {runs[2]['candidate'][:8]}")
            return runs[2]
        time.sleep(0.05)
    return None


def check(out: Path, args: argparse.Namespace, victim: dict | None, returncode: int) -> dict:
    """Read the run's archive and traces; every check's outcome, and the figures."""
    store = Store(out / "run" / "archive.db", readonly=True)
    try:
        rows = store.conn.execute(
            "SELECT id, status FROM candidates WHERE status IN ('done', 'failed')"
        ).fetchall()
        evaluations = {cid: store.evaluation(cid) for cid, _ in rows}
        pending = store.conn.execute(
            "SELECT COUNT(*) FROM candidates WHERE status IN ('proposed', 'evaluating')"
        ).fetchone()[0]
        problems = store.integrity_problems()
    finally:
        store.close()
    ok = [e for e in evaluations.values() if e is not None and e.ok]
    per_gpu: dict[str, list[float]] = {}
    for e in ok:
        per_gpu.setdefault(e.artifacts.get("cuda_visible_devices", "?"), []).append(
            e.metrics["tflops"]
        )
    checks = {
        "run exited 0": returncode == 0,
        f"{args.candidates} candidates evaluated, none failed": len(ok) == args.candidates,
        "none left proposed/evaluating": pending == 0,
        "archive integrity": not problems,
        "CUDA_VISIBLE_DEVICES == ray.get_gpu_ids()": all(
            e.metrics["env_matches_ray"] == 1 for e in ok
        ),
        "candidate process sees the task's GPU": all(
            e.metrics["candidate_sees_gpu"] == 1 for e in ok
        ),
        "matmul correct": all(e.metrics["matmul_ok"] == 1 for e in ok),
    }
    if not args.cpu:
        checks["torch sees exactly 1 GPU per task"] = all(
            e.metrics["cuda_devices"] == 1 for e in ok
        )
    if victim is not None:
        victim_eval = evaluations.get(victim["candidate"])
        runs = [t for t in traces(out / "traces") if t["candidate"] == victim["candidate"]]
        checks["killed worker's candidate run again, recorded once"] = (
            victim_eval is not None
            and victim_eval.ok
            and "WorkerCrashedError" in victim_eval.artifacts.get("lost_workers", "")
            and len(runs) == 2
        )
    else:
        checks["a worker was killed mid-run"] = args.no_kill
    return {
        "checks": checks,
        "integrity_problems": problems,
        "devices": sorted({e.artifacts.get("device", "?") for e in ok}),
        "gpus_used": sorted(per_gpu),
        "tflops_median_per_gpu": {g: round(statistics.median(v), 1) for g, v in per_gpu.items()},
        "victim": victim,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=12)
    parser.add_argument("--gpus", help="CUDA_VISIBLE_DEVICES for the run (default: all)")
    parser.add_argument("--address", default="local", help="backend.address (default: local)")
    parser.add_argument("--size", type=int, default=8192, help="matmul size on a GPU")
    parser.add_argument("--sleep", type=float, default=2.0, help="seconds each evaluation sleeps")
    parser.add_argument("--smoke", action="store_true", help="4 candidates, 1024 matmul")
    parser.add_argument("--cpu", action="store_true", help="no GPU: fake one in Ray, torch on CPU")
    parser.add_argument("--cpu-gpus", type=int, default=1, help="fake GPUs with --cpu")
    parser.add_argument("--no-kill", action="store_true", help="do not kill a worker")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "ray_gpu_out")))
    parser.add_argument("--timeout", type=float, default=540, help="seconds before giving up")
    args = parser.parse_args()
    if args.smoke:
        args.candidates, args.size = 4, 1024

    out = args.out.resolve() / "ray_gpu"
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(REPO)) if p)
    if args.gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = args.gpus
    start = time.monotonic()
    search = start_search(args, out, env)
    victim = None
    try:
        if not args.no_kill:
            victim = kill_third_worker(search, out / "traces", args.timeout)
        returncode = search.wait(timeout=max(1.0, args.timeout - (time.monotonic() - start)))
    except subprocess.TimeoutExpired:
        os.killpg(search.pid, signal.SIGKILL)
        returncode = search.wait()
    wall = time.monotonic() - start
    if not (out / "run" / "archive.db").exists():
        tail = (out / "evolve.out").read_text()[-3000:]
        sys.exit(f"the search did not start (exit {returncode}); its output ends with:\n{tail}")
    result = check(out, args, victim, returncode)
    result |= {"wall_s": round(wall, 1), "args": {k: str(v) for k, v in vars(args).items()}}
    (out / "ray_gpu.json").write_text(json.dumps(result, indent=2, default=str))

    print(f"\nray backend GPU run: {args.candidates} candidates in {wall:.0f} s")
    print(f"devices: {', '.join(result['devices'])}; GPUs used: {', '.join(result['gpus_used'])}")
    for gpu, tflops in result["tflops_median_per_gpu"].items():
        print(f"  GPU {gpu}: median {tflops} TFLOP/s (bf16 matmul {args.size})")
    for name, passed in result["checks"].items():
        print(f"  [{'ok' if passed else 'FAIL'}] {name}")
    print(f"full results: {out}/ray_gpu.json, log: {out}/evolve.out, {out}/run/evolve.log")
    if not all(result["checks"].values()):
        if returncode != 0:
            print("the search's output ends with:\n" + (out / "evolve.out").read_text()[-4000:])
        sys.exit(1)


if __name__ == "__main__":
    main()
