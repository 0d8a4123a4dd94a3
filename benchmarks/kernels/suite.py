"""Score a directory of solutions over every problem of a dataset (the suite score).

A solution for problem ``P`` is ``<solutions>/P/kernel.py`` (with any helper files beside
it) or ``<solutions>/P.py``. A problem without a solution, or whose solution fails,
scores 0; the suite score is the mean over problems.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .harness import Harness, Report, Settings
from .score import suite_score
from .spec import load_problem, problem_dirs


def solution_files(solutions: Path, problem: str) -> Path | None:
    """The folder or file holding the solution for ``problem``, if any."""
    if (solutions / problem / "kernel.py").is_file() or list(
        (solutions / problem).glob("solution*.json")
    ):
        return solutions / problem
    if (solutions / f"{problem}.py").is_file():
        return solutions / f"{problem}.py"
    return None


def stage(solution: Path, workdir: Path, definition_json: str, reference: str) -> None:
    """Copy a solution (a folder, a kernel .py, or an upstream solution*.json) into a fresh
    working folder, with the harness's definition and reference."""
    if (
        solution.suffix == ".json"
        or solution.is_dir()
        and not (solution / "kernel.py").is_file()
        and list(solution.glob("solution*.json"))
    ):
        from .solution import load_solution
        from .solution import stage as stage_solution

        stage_solution(load_solution(solution), workdir)
    elif solution.is_dir():
        shutil.copytree(
            solution, workdir, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__")
        )
    else:
        shutil.copy(solution, workdir / "kernel.py")
    (workdir / "definition.json").write_text(definition_json)
    (workdir / "reference.py").write_text(reference)


def run_suite(
    solutions: Path,
    dataset: Path,
    settings: Settings,
    *,
    problems: Sequence[str] = (),
    calibration: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Score every problem; returns {"score", "problems": {name: report dict or missing}}."""
    dirs = problem_dirs(dataset)
    names = [n for n in sorted(dirs) if not problems or n in problems]
    results: dict[str, Any] = {}
    scores: list[float | None] = []
    for name in names:
        problem = load_problem(dirs[name])
        solution = solution_files(solutions, name)
        if solution is None:
            results[name] = {
                "status": "missing",
                "score": 0.0,
                "message": f"no {name}/kernel.py or {name}.py",
            }
            scores.append(None)
            continue
        harness = Harness(problem, settings, calibration=calibration)
        with tempfile.TemporaryDirectory(prefix=f"evolve-kernels-{name}-") as tmp:
            workdir = Path(tmp)
            stage(
                solution,
                workdir,
                (problem.root / "definition.json").read_text(),
                problem.definition.reference,
            )
            try:
                report = harness.evaluate(workdir, env=dict(env or {}))
            except Exception as exc:  # the harness itself failed on this problem: record, go on
                report = Report(
                    problem=name, status="error", message=f"{type(exc).__name__}: {exc}"
                )
        results[name] = report.as_dict()
        scores.append(report.score if report.status == "ok" else None)
    return {"score": suite_score(scores), "problems": results}


def markdown(result: Mapping[str, Any]) -> str:
    """A Markdown table of a suite result."""
    lines = ["| problem | status | score | note |", "| --- | --- | ---: | --- |"]
    for name, r in result["problems"].items():
        note = str(r.get("message", "")).replace("|", "/").replace("\n", " ")[:120]
        lines.append(f"| {name} | {r['status']} | {r.get('score', 0.0):.4f} | {note} |")
    lines.append(f"| **suite** | | **{result['score']:.4f}** | mean over problems, failures 0 |")
    return "\n".join(lines)
