"""Score the kernel seeds and upstream's CPU-runnable example solutions on the CPU (Triton's interpreter).

``python -m evolve.benchmarks.kernels.cpu_check [--examples DIR] [--runs N]`` prints one line
per (problem, candidate): its status and score per run, each problem on its first workload
with a fixed calibration, so two versions of the harness can be compared on this machine
(scores on the CPU mean little as speed; they show that honest candidates are accepted and
scored alike). Upstream's examples are read from ``--examples`` (``pytorch/`` and
``triton/``; the C++ and other languages need a GPU toolchain).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from .harness import Harness, Settings
from .spec import load_problem
from .suite import stage

HERE = Path(__file__).parent
CALIBRATION = {"device": "cpu-check", "bandwidth_bytes_per_s": 2e10, "matrix_flops_per_s": {"bfloat16": 1e11}}
# our seeds on their problems, the first workload's axes made small enough for the interpreter
SEEDS = (("rmsnorm", "reference", {"T": 16}), ("rmsnorm", "rmsnorm_triton", {"T": 16}),
         ("silu_and_mul", "silu_mul_triton", {"T": 4}), ("softmax", "softmax_triton", {"R": 16, "C": 1024}))  # fmt: skip
EXAMPLE_LANGUAGES = ("pytorch", "triton")


def small(problem: str, axes: dict[str, int], root: Path) -> Path:
    """A copy of our suite's ``problem`` in ``root`` whose one workload is its first with ``axes``."""
    folder = root / problem
    if not folder.is_dir():
        shutil.copytree(HERE / "problems" / problem, folder)
        first = json.loads((folder / "workload.jsonl").read_text().splitlines()[0])
        first["axes"].update(axes)
        (folder / "workload.jsonl").write_text(json.dumps(first) + "\n")
    return folder


def pairs(examples: Path | None, root: Path) -> list[tuple[Path, Path]]:
    """(problem folder, candidate) for every seed and every CPU-runnable upstream example."""
    found = [(small(problem, axes, root), HERE / "seeds" / seed) for problem, seed, axes in SEEDS]
    for language in EXAMPLE_LANGUAGES if examples else ():
        for folder in sorted((examples / language).iterdir()):
            found.append((folder, next(folder.glob("solution*.json"))))
    return found


def score(problem_dir: Path, candidate: Path, settings: Settings) -> tuple[str, float, float]:
    """(status and message, score, seconds) of one evaluation of ``candidate`` on its first workload."""
    problem = load_problem(problem_dir)
    s = Settings(**{**settings.__dict__, "workloads": (problem.workloads[0].uuid,)})
    harness = Harness(problem, s, calibration=CALIBRATION)
    with tempfile.TemporaryDirectory(prefix="evolve-kernels-check-") as tmp:
        stage(candidate, Path(tmp), (problem_dir / "definition.json").read_text(), problem.definition.reference)
        started = time.monotonic()
        report = harness.evaluate(Path(tmp), env={"TRITON_INTERPRET": "1"})
    status = report.status if report.status == "ok" else f"{report.status}: {report.message[:160]}"
    return status, report.score, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    """Score every pair ``--runs`` times and print one line each."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=Path, help="upstream's examples folder (sol-execbench-examples)")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--only", action="append", default=[], help="score only these problems (repeatable)")
    args = parser.parse_args(argv)
    os.environ["TRITON_INTERPRET"] = "1"
    settings = Settings(device="cpu", rounds=2, warmup=1, iters=args.iters, audits=1, baseline="eager",
                        timeout_s=600.0)  # fmt: skip
    failures = 0
    root = Path(tempfile.mkdtemp(prefix="evolve-kernels-check-problems-"))
    for problem_dir, candidate in pairs(args.examples, root):
        if args.only and problem_dir.name not in args.only:
            continue
        runs = [score(problem_dir, candidate, settings) for _ in range(args.runs)]
        failures += sum(status != "ok" for status, _, _ in runs)
        shown = "  ".join(f"{value:.3f}" if status == "ok" else status for status, value, _ in runs)
        seconds = sum(s for _, _, s in runs) / len(runs)
        print(f"{problem_dir.name:<20} {candidate.name:<28} {shown}   ({seconds:.1f} s/evaluation)", flush=True)
    shutil.rmtree(root)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
