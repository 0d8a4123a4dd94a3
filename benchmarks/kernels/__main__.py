"""Command line of the kernels benchmark: ``python -m evolve.benchmarks.kernels COMMAND``.

Commands:
  problems              list the problems of a dataset (default: our suite)
  calibrate             measure bandwidth and matrix rates; print and store them as JSON
  score PROBLEM DIR     score one candidate folder (with kernel.py) on one problem
  suite SOLUTIONS       score a folder of solutions over all problems (the suite score)
  download              fetch upstream's dataset (resumes, verifies checksums)
  stage SOLUTION OUT    write an upstream solution*.json as a candidate folder (an evolve seed)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evolve.types import EvolveError


def _settings(args: argparse.Namespace):  # noqa: ANN202 - Settings, imported lazily
    from .fitness import resolve_device
    from .harness import Settings

    return Settings(
        device=resolve_device(args.device), rounds=args.rounds, warmup=args.warmup, iters=args.iters,
        repeats=args.repeats, baseline=args.baseline, quick_calibration=args.quick,
    )  # fmt: skip


def _calibration(args: argparse.Namespace) -> dict | None:
    return json.loads(Path(args.calibration).read_text()) if args.calibration else None


def _write(out: str | None, name: str, text: str) -> None:
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / name).write_text(text)


def cmd_problems(args: argparse.Namespace) -> int:
    from .fitness import SUITE
    from .spec import load_problem, problem_dirs

    for name, path in problem_dirs(args.dataset or SUITE).items():
        problem = load_problem(path)
        print(
            f"{name:<20} {problem.definition.op_type or '-':<13} {len(problem.workloads)} workloads  {path}"
        )
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    import torch

    from .calibrate import calibrate
    from .fitness import resolve_device

    result = calibrate(torch.device(resolve_device(args.device)), quick=args.quick)
    text = json.dumps(result, indent=2)
    print(text)
    _write(args.out, "calibration.json", text + "\n")
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    import tempfile

    from .fitness import SUITE
    from .harness import Harness
    from .spec import find_problem
    from .suite import stage

    problem = find_problem(args.dataset or SUITE, args.problem)
    harness = Harness(problem, _settings(args), calibration=_calibration(args))
    with tempfile.TemporaryDirectory(prefix="evolve-kernels-score-") as tmp:
        stage(
            Path(args.candidate),
            Path(tmp),
            (problem.root / "definition.json").read_text(),
            problem.definition.reference,
        )
        report = harness.evaluate(Path(tmp), env={})
    print(report.table())
    _write(args.out, f"{problem.name}.json", json.dumps(report.as_dict(), indent=2))
    return 0 if report.status == "ok" else 1


def cmd_suite(args: argparse.Namespace) -> int:
    from .fitness import SUITE
    from .suite import markdown, run_suite

    problems = [p for p in (args.problems or "").split(",") if p]
    result = run_suite(Path(args.solutions), Path(args.dataset or SUITE), _settings(args), problems=problems,
                       calibration=_calibration(args))  # fmt: skip
    print(markdown(result))
    _write(args.out, "suite.json", json.dumps(result, indent=2))
    _write(args.out, "suite.md", markdown(result) + "\n")
    return 0


def cmd_stage(args: argparse.Namespace) -> int:
    from .solution import load_solution, stage

    solution = load_solution(args.solution)
    stage(solution, Path(args.out))
    print(
        f"{solution.name} ({'+'.join(solution.languages)}) staged in {args.out}; editable: {', '.join(solution.sources)}"
    )
    return 0


def cmd_download(args: argparse.Namespace) -> int:
    from .download import download

    counts = download(Path(args.out), repo=args.repo, revision=args.revision, endpoint=args.endpoint,
                      include=args.include)  # fmt: skip
    print(
        f"{counts['fetched']} file(s) fetched, {counts['kept']} already present and verified, in {args.out}"
    )
    return 0


def parser() -> argparse.ArgumentParser:
    """The argument parser (every command has --help)."""
    top = argparse.ArgumentParser(
        prog="python -m evolve.benchmarks.kernels", description=__doc__.split("\n")[0]
    )
    sub = top.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--dataset", help="folder of problems in the SOL-ExecBench layout (default: our suite)"
        )
        p.add_argument(
            "--device", default="auto", help="auto (a GPU), cuda, or cpu with TRITON_INTERPRET=1"
        )
        p.add_argument("--out", help="folder to write results into")

    p = sub.add_parser("problems", help="list the problems of a dataset")
    common(p)
    p.set_defaults(fn=cmd_problems)
    p = sub.add_parser("stage", help="write an upstream solution*.json as a candidate folder")
    p.add_argument("solution", help="solution*.json, or a folder holding one")
    p.add_argument("out", help="folder to write solution.json and its sources into")
    p.set_defaults(fn=cmd_stage)
    p = sub.add_parser(
        "download", help="fetch upstream's dataset with resume and checksum verification"
    )
    p.add_argument("--out", required=True, help="folder to download into")
    p.add_argument("--repo", default="nvidia/SOL-ExecBench", help="Hugging Face dataset repository")
    p.add_argument("--revision", default="main")
    p.add_argument("--endpoint", default="https://huggingface.co", help="the Hub or a mirror")
    p.add_argument("--include", default="*", help="glob of repository paths to fetch")
    p.set_defaults(fn=cmd_download)
    p = sub.add_parser("calibrate", help="measure bandwidth and matrix rates")
    common(p)
    p.add_argument("--quick", action="store_true", help="small sizes (smoke tests)")
    p.set_defaults(fn=cmd_calibrate)
    for name, fn, helptext in (("score", cmd_score, "score one candidate on one problem"),
                               ("suite", cmd_suite, "score a folder of solutions over all problems")):  # fmt: skip
        p = sub.add_parser(name, help=helptext)
        common(p)
        if name == "score":
            p.add_argument("problem", help="problem name")
            p.add_argument(
                "candidate",
                help="folder holding kernel.py or a solution, a .py file, or a solution*.json",
            )
        else:
            p.add_argument(
                "solutions", help="folder with <problem>/kernel.py or <problem>.py per problem"
            )
            p.add_argument("--problems", help="comma-separated subset of problems")
        p.add_argument(
            "--calibration", help="calibration.json from the calibrate command (else measured)"
        )
        p.add_argument("--baseline", default="compile", choices=("compile", "eager"))
        p.add_argument("--rounds", type=int, default=10)
        p.add_argument("--warmup", type=int, default=10)
        p.add_argument("--iters", type=int, default=50)
        p.add_argument("--repeats", type=int, default=1)
        p.add_argument("--quick", action="store_true", help="quick calibration (small sizes)")
        p.set_defaults(fn=fn)
    return top


def main(argv: list[str] | None = None) -> int:
    """Run one command; user errors print their message (no traceback) and exit 2."""
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except EvolveError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
