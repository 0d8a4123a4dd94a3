"""``KernelFitness``: the kernels benchmark as an evolve fitness (one problem, SOL score to maximise).

Config: ``benchmark=kernels benchmark.fitness.problem=<name>`` picks a problem of our
suite; ``benchmark.fitness.dataset=<dir>`` points at another folder in the SOL-ExecBench
layout (for example a copy of that dataset). The candidate is a module ``kernel.py``
with ``run(*inputs, *outputs)``. Kernels need a CUDA GPU: without one the fitness
refuses to start, unless TRITON_INTERPRET=1 is set (Triton's CPU interpreter, for tests;
its timings mean nothing).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evolve.harness import phases
from evolve.harness.fitness import EvalContext
from evolve.types import Descriptor, Direction, EvalStatus, Evaluation, EvolveError, Objective

from .harness import Harness, Report, Settings
from .solution import read_candidate
from .spec import Problem, SpecError, find_problem

SUITE = Path(__file__).parent / "problems"
_STATUS = {"ok": EvalStatus.OK, "invalid": EvalStatus.INVALID, "incorrect": EvalStatus.INVALID, "error": EvalStatus.ERROR,
           "timeout": EvalStatus.TIMEOUT, "cheat": EvalStatus.REJECTED}  # fmt: skip


def resolve_device(device: str = "auto") -> str:
    """'cuda' when a GPU is visible; 'cpu' only under TRITON_INTERPRET=1; otherwise a clear error."""
    import torch

    if device in ("auto", "cuda") and torch.cuda.is_available():
        return "cuda"
    if device in ("auto", "cpu") and os.environ.get("TRITON_INTERPRET") == "1":
        return "cpu"
    raise EvolveError(
        "the kernels benchmark needs a CUDA GPU, and torch sees none here "
        f"(torch {torch.__version__}, torch.cuda.is_available() is False). Run it on a GPU machine with a CUDA "
        "build of torch and triton (pip install 'evolve[gpu]'); for tests only, TRITON_INTERPRET=1 runs Triton "
        "kernels on the CPU interpreter (timings are then meaningless)."
    )


def absolute(path: str) -> Path:
    """A user's path made absolute against the directory evolve was started in (Hydra's
    original cwd when Hydra changed it), so the sandboxed processes find it from their own."""
    candidate = Path(path).expanduser()
    if candidate.is_absolute():
        return candidate
    try:
        from hydra.utils import get_original_cwd

        return Path(get_original_cwd()) / candidate
    except (ImportError, ValueError):  # not inside a Hydra run
        return candidate.resolve()


def problem_statement(problem: Problem) -> str:
    """The problem as operators see it: description, tensors, workloads and the reference source."""
    d = problem.definition
    lines = [f"Problem {d.name} ({d.op_type or 'kernel'}): {d.description}".strip()]
    axes = ", ".join(
        f"{a.name}={a.value}"
        if a.kind == "const"
        else (f"{a.name}={a.expression}" if a.kind == "expr" else f"{a.name} (varies)")
        for a in d.axes.values()
    )
    lines.append(f"Axes: {axes}")
    for role, specs in (("input", d.inputs), ("output", d.outputs)):
        for s in specs.values():
            shape = "Python scalar" if s.shape is None else "[" + ", ".join(s.shape) + "]"
            lines.append(f"  {role} {s.name}: {shape} {s.dtype}")
    lines.append(
        "Workloads: "
        + "; ".join(", ".join(f"{k}={v}" for k, v in w.axes.items()) for w in problem.workloads)
    )
    lines.append(
        "Call: run(" + ", ".join([*d.inputs, *d.outputs]) + ")  # write the outputs in place"
    )
    lines.append("Reference (reference.py):\n" + d.reference)
    return "\n".join(lines)


class KernelFitness:
    """SOL score of a candidate kernel on one problem (0.5 = torch.compile baseline, 1.0 = roofline).

    Args:
        problem: the problem's name (its definition ``name``).
        dataset: folder of problem folders in the SOL-ExecBench layout; default our suite.
        device: "auto" (a GPU, else refuse), "cuda", or "cpu" (only with TRITON_INTERPRET=1).
        rounds, warmup, iters, repeats, audits: measurement counts (defaults as in SOL-ExecBench).
        baseline: "compile" (T_b = reference under torch.compile) or "eager".
        calibration: path to a JSON written by ``python -m evolve.benchmarks.kernels calibrate``;
            without it the machine is calibrated once per worker process.
        workloads: optional subset of workload uuids.
        allow_above_sol: keep a score above 1 (else the evaluation is rejected as a measurement fault).
        timeout_s: wall-clock limit of the candidate's process.
        score_mode: "local" (T_b and T_SOL measured here) or "published" (upstream's published
            per-workload times; comparable only on the hardware they were measured on).
        inputs: "shifted" (upstream: the same values at a new address per timed call) or "fresh".
        batch: timed calls per batch; the timer (``timer.py``) times each batch on its own clock.
    """

    def __init__(
        self,
        *,
        problem: str = "rmsnorm",
        dataset: str | None = None,
        device: str = "auto",
        rounds: int = 10,
        warmup: int = 10,
        iters: int = 50,
        repeats: int = 1,
        audits: int = 3,
        baseline: str = "compile",
        calibration: str | None = None,
        workloads: Sequence[str] = (),
        allow_above_sol: bool = False,
        timeout_s: float = 900.0,
        quick_calibration: bool = False,
        score_mode: str = "local",
        inputs: str = "shifted",
        batch: int = 10,
    ) -> None:
        if score_mode not in ("local", "published"):
            raise EvolveError(
                f"kernels: score_mode must be 'local' or 'published', got {score_mode!r}"
            )
        if inputs not in ("shifted", "fresh") or batch < 1:
            raise EvolveError(f"kernels: inputs must be 'shifted' or 'fresh' (got {inputs!r}), batch at least 1 (got {batch})")
        self.score_mode = score_mode
        if baseline not in ("compile", "eager"):
            raise EvolveError(f"kernels: baseline must be 'compile' or 'eager', got {baseline!r}")
        self.problem = find_problem(absolute(dataset) if dataset else SUITE, problem)
        self.settings = Settings(
            device=resolve_device(device), rounds=rounds, warmup=warmup, iters=iters, repeats=repeats, audits=audits,
            baseline=baseline, workloads=tuple(workloads), timeout_s=timeout_s, quick_calibration=quick_calibration,
            inputs=inputs, batch=batch,
        )  # fmt: skip
        missing = [w.uuid for w in self.problem.workloads if w.uuid not in self.problem.published]
        if score_mode == "published" and missing:
            raise EvolveError(
                f"kernels: score_mode=published, but {self.problem.name} has no published times for workloads "
                f"{missing[:5]} (published.json beside definition.json, or a 'published' object per workload line); "
                "use score_mode=local"
            )
        self.calibration = json.loads(Path(calibration).read_text()) if calibration else None
        self.allow_above_sol = allow_above_sol
        self.objective = Objective(name="sol_score", direction=Direction.MAXIMIZE)
        self.descriptors = (
            Descriptor(name="kernels_launched", low=1, high=9, bins=8),
            Descriptor(name="code_lines", low=0, high=300, bins=6),
        )

    @property
    def benchmark_overrides(self) -> dict[str, Any]:
        """On the CPU (Triton interpreter) an evaluation needs no GPU slot."""
        return {"gpus": 0} if self.settings.device == "cpu" else {}

    def prepare(self, workdir: Path) -> None:
        """Write the harness's files (definition.json, reference.py) into the candidate's folder."""
        workdir.joinpath("definition.json").write_text(
            (self.problem.root / "definition.json").read_text()
        )
        workdir.joinpath("reference.py").write_text(self.problem.definition.reference)

    def measure(self, workdir: Path, ctx: EvalContext) -> Report:
        """The full report of one candidate (used by ``evaluate`` and the suite command)."""
        self.prepare(workdir)
        harness = Harness(self.problem, self.settings, calibration=self.calibration)
        return harness.evaluate(workdir, env=ctx.env(), strict=ctx.strict)

    def evaluate(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        """Score the candidate in ``workdir``; failures become non-OK evaluations with the reason.

        It marks where the evaluation's time went (``evolve.harness.phases``: calibration,
        baseline, build, process_start, candidate_import, correctness, timing,
        process_exit, scoring...); ``evaluate_safely`` stores them as ``time_<phase>``.
        """
        report = self.measure(workdir, ctx)
        phases.mark_each(report.marks)
        return self._evaluation(workdir, report)

    def _evaluation(self, workdir: Path, report: Report) -> Evaluation:
        metrics: dict[str, Any] = {"score": report.score}
        for row in report.rows:
            for key in ("kernel_ms", "baseline_ms", "sol_ms", "score", "cv"):
                value = getattr(row, key)
                if value is not None:
                    metrics[f"{row.uuid}/{key}"] = value
        methods = [r.flops_method for r in report.rows]
        metrics["flops_counted_on_real_inputs"] = float(sum(m.startswith("real") for m in methods))
        metrics["flops_memory_bound_only"] = float(sum(m.startswith("none") for m in methods))
        if report.published_score is not None:
            metrics["published_score"] = report.published_score
        notes = [f"timer: {report.timer or '-'}", f"language: {report.language}"]
        notes += [f"{r.uuid}: FLOPs {r.flops_method}" for r in report.rows if r.flops_method]
        phases.mark("feedback")  # its cost, measured per evaluation (time_feedback)
        artifacts = {"results": report.table(), "problem": problem_statement(self.problem),
                     "measurement": "\n".join(notes), "roofline": report.roofline()}  # fmt: skip
        phases.mark("scoring")
        if report.output:
            artifacts["output"] = report.output
        try:
            solution = read_candidate(workdir)
        except SpecError:  # the harness has already reported what is wrong with it
            solution = None
        if solution is not None:
            artifacts["language"] = solution.rules()
        status = _STATUS.get(report.status, EvalStatus.ERROR)
        flagged = [r.uuid for r in report.rows if r.flagged]
        if status == EvalStatus.OK and flagged and not self.allow_above_sol:
            status = EvalStatus.REJECTED
            report.message = f"score above 1 on {flagged}: faster than the roofline, so the SOL bound or the timing is wrong"
        if status != EvalStatus.OK:
            artifacts["error"] = report.message or report.status
            return Evaluation(status=status, metrics=metrics, artifacts=artifacts)
        files = list(solution.sources) if solution else ["kernel.py"]
        kernel_text = "\n".join((workdir / f).read_text() for f in files if (workdir / f).is_file())
        descriptors = {
            "kernels_launched": float(sum(report.kernels.values()) or 1),
            "code_lines": float(sum(1 for line in kernel_text.splitlines() if line.strip())),
        }
        fitness = report.published_score if self.score_mode == "published" else report.score
        return Evaluation(
            status=status,
            fitness=fitness,
            metrics=metrics,
            descriptors=descriptors,
            artifacts=artifacts,
        )
