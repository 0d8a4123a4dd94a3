"""``KernelSuiteFitness``: one evolve run over many kernel problems at once.

A candidate holds one kernel per problem (``<problem>/kernel.py``, or a solution.json and
its sources, in a folder per problem); its fitness is the suite score as upstream
aggregates it: the mean over problems of each problem's mean over workloads, a failed
problem counting 0. Why this shape: the archive keeps whole suites, so the built-in
EVOLVE-BLOCK crossover and LLM crossover combine one parent's kernel for a problem with
another's for a different problem, and an operator that sees an elite (its inspirations)
sees every problem's kernel side by side -- a trick found on one problem is there to be
copied to the others. The descriptor ``lead_problem`` (one bin per problem) is the
problem on which the candidate gains most over the plain reference (its score minus the
reference's own score on that problem, both from measurements the harness already
makes), so the archive keeps specialists for every problem instead of one generalist.

Each problem is measured by its own sandboxed timer, as in single-problem runs; a
problem whose folder did not change since an earlier evaluation in this process reuses
that measurement (keyed by the SHA-256 of the folder's files), so a mutation that
touches one kernel costs one problem's measurement, not the suite's.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evolve.harness import phases
from evolve.harness.fitness import EvalContext
from evolve.harness.hashing import files_digest
from evolve.types import Descriptor, Direction, EvalStatus, Evaluation, EvolveError, Objective

from .fitness import SUITE, KernelFitness, absolute, problem_statement
from .harness import Harness, Report
from .score import sol_score, suite_score
from .spec import SpecError, load_problem, problem_dirs

SEEDS = Path(__file__).parent / "seeds"
TRITON_SEEDS = {
    "rmsnorm": "rmsnorm_triton",
    "softmax": "softmax_triton",
    "silu_and_mul": "silu_mul_triton",
}
_MEASURED: dict[str, Report] = {}  # per process: folder hash -> report


def select_problems(
    dataset: Path, problems: Sequence[str], category: str | None
) -> dict[str, Path]:
    """The problems of a suite run: named ones, or those under a dataset sub-folder (category), or all."""
    found = problem_dirs(dataset)
    if category:
        found = {
            n: p
            for n, p in found.items()
            if category in p.relative_to(dataset.resolve()).parts[:-1]
        }
    if problems:
        missing = [p for p in problems if p not in found]
        if missing:
            raise EvolveError(
                f"kernels_suite: problems {missing} not found; available: {', '.join(sorted(found))}"
            )
        found = {p: found[p] for p in problems}
    if not found:
        raise EvolveError(
            f"kernels_suite: no problems selected in {dataset} (category {category!r})"
        )
    return dict(sorted(found.items()))


def folder_hash(folder: Path) -> str:
    """SHA-256 over the relative paths and contents of a folder's files (the harness layer's digest)."""
    files = [p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return files_digest(files, root=folder)


class KernelSuiteFitness:
    """Suite score of a candidate holding one kernel per problem (0.5 = compiled baselines everywhere).

    Args:
        problems: problem names; empty means every problem (of ``category`` when given).
        category: a sub-folder of the dataset (for example upstream's ``L1``), instead of a list.
        dataset: folder of problem folders; default our suite.
        workloads_per_problem: score only each problem's first N workloads (0: all), for short runs.
        other arguments: as ``KernelFitness`` (device, counts, baseline, calibration, inputs, batch...).
    """

    def __init__(self, *, problems: Sequence[str] = (), category: str | None = None, dataset: str | None = None,
                 workloads_per_problem: int = 0, **settings: Any) -> None:  # fmt: skip
        root = absolute(dataset) if dataset else SUITE
        self.dirs = select_problems(root, tuple(problems), category)
        self.members = {}
        for name, folder in self.dirs.items():
            chosen = [w.uuid for w in load_problem(folder).workloads][
                : workloads_per_problem or None
            ]
            self.members[name] = KernelFitness(
                problem=name, dataset=str(root), workloads=chosen, **settings
            )
        first = next(iter(self.members.values()))
        self.objective = Objective(name="suite_sol_score", direction=Direction.MAXIMIZE)
        self.descriptors = (
            Descriptor(name="lead_problem", low=0, high=len(self.dirs), bins=len(self.dirs)),
            Descriptor(name="code_lines", low=0, high=300 * len(self.dirs), bins=6),
        )
        self._seed = self._make_seed()
        self._device = first.settings.device

    @property
    def benchmark_overrides(self) -> dict[str, Any]:
        """The generated seed (one kernel per problem); no GPU slot on the CPU interpreter."""
        return {"seed": str(self._seed), **({"gpus": 0} if self._device == "cpu" else {})}

    def _make_seed(self) -> Path:
        """A folder per problem: our Triton seed where we have one, else the problem's reference;
        removed when this process exits (copies of this fitness in workers only name it)."""
        seed = Path(tempfile.mkdtemp(prefix="evolve-kernels-suite-seed-"))
        atexit.register(shutil.rmtree, seed, True)
        for name in self.dirs:
            source = SEEDS / TRITON_SEEDS.get(name, "reference")
            shutil.copytree(source, seed / name, ignore=shutil.ignore_patterns("__pycache__"))
        return seed

    def prepare(self, workdir: Path) -> None:
        for name, member in self.members.items():
            (workdir / name).mkdir(exist_ok=True)
            member.prepare(workdir / name)

    def measure(
        self, workdir: Path, ctx: EvalContext, timeline: Report | None = None
    ) -> dict[str, Report]:
        """Every problem's report (reused when its folder is unchanged since an earlier measurement,
        never under ``ctx.strict``); the marks of those measured now are added to ``timeline``."""
        self.prepare(workdir)
        reports = {}
        for name, member in self.members.items():
            key = f"{name}|{folder_hash(workdir / name)}|{member.settings}|{ctx.strict}"
            if key not in _MEASURED:
                harness = Harness(member.problem, member.settings, calibration=member.calibration)
                try:
                    _MEASURED[key] = harness.evaluate(
                        workdir / name, env=ctx.env(), strict=ctx.strict
                    )
                except SpecError as exc:
                    _MEASURED[key] = Report(problem=name, status="error", message=str(exc))
                if timeline is not None:
                    timeline.marks += _MEASURED[key].marks
            reports[name] = _MEASURED[key]
        return reports

    def evaluate(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        """Per-problem and aggregate scores; a cheat on any problem rejects the candidate.

        Phases marked as in ``KernelFitness``, added up over the problems measured.
        """
        timeline = Report(problem="suite")
        reports = self.measure(workdir, ctx, timeline)
        phases.mark_each(timeline.marks)
        phases.mark("scoring")
        return self._evaluation(workdir, reports)

    def _evaluation(self, workdir: Path, reports: dict[str, Report]) -> Evaluation:
        metrics: dict[str, Any] = {}
        gains = []
        scores: dict[str, float | None] = {}
        for name, report in reports.items():
            ok = report.status == "ok"
            chosen = (
                report.published_score
                if self.members[name].score_mode == "published"
                else report.score
            )
            scores[name] = chosen if ok else None
            metrics[f"{name}/score"] = chosen if ok and chosen is not None else 0.0
            reference = [sol_score(r.reference_ms, r.baseline_ms, r.sol_ms) for r in report.rows
                         if r.reference_ms and r.baseline_ms and r.sol_ms is not None]  # fmt: skip
            ref_score = sum(reference) / len(reference) if reference else 0.0
            metrics[f"{name}/reference_score"] = ref_score
            gains.append(metrics[f"{name}/score"] - ref_score)
        aggregate = suite_score(scores.values())
        metrics["score"] = aggregate
        table = "\n\n".join(r.table() for r in reports.values())
        artifacts = {
            "results": table,
            "problem": "\n\n".join(problem_statement(m.problem) for m in self.members.values()),
            "roofline": "\n".join(r.roofline() for r in reports.values() if r.roofline()),
        }
        cheats = {n: r.message for n, r in reports.items() if r.status == "cheat"}
        if cheats:
            artifacts["error"] = "; ".join(f"{n}: {m}" for n, m in cheats.items())
            return Evaluation(status=EvalStatus.REJECTED, metrics=metrics, artifacts=artifacts)
        failed = {
            n: f"{r.status}: {r.message}"[:400] for n, r in reports.items() if r.status != "ok"
        }
        if failed:
            artifacts["failed problems (scored 0)"] = "\n".join(
                f"{n}: {m}" for n, m in failed.items()
            )
        lines = sum(
            sum(1 for line in p.read_text().splitlines() if line.strip())
            for p in workdir.rglob("*") if p.is_file() and p.suffix in (".py", ".cu", ".cpp", ".h", ".cuh")
            and p.name not in ("reference.py",)
        )  # fmt: skip
        descriptors = {
            "lead_problem": float(max(range(len(gains)), key=gains.__getitem__)),
            "code_lines": float(lines),
        }
        return Evaluation(status=EvalStatus.OK, fitness=aggregate, metrics=metrics, descriptors=descriptors,
                          artifacts=artifacts)  # fmt: skip
