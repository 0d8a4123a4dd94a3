"""The fitness contract: what a benchmark implements, how it is run safely, and its statistics.

Benchmarks import only this module and ``evolve.types``. A fitness scores a candidate's
files in a working directory; it runs the candidate's code through ``run_sandboxed`` and
computes the score itself from outputs the candidate cannot fake.
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from evolve.sandbox import Limits, Policy, Result
from evolve.sandbox import run as run_sandboxed
from evolve.types import Descriptor, EvalStatus, Evaluation, Files, Objective

__all__ = [
    "Benchmark",
    "EvalContext",
    "Fitness",
    "Limits",
    "Policy",
    "Result",
    "Stage",
    "evaluate_safely",
    "one_sided_pvalue",
    "run_sandboxed",
]


@dataclass(frozen=True, kw_only=True)
class EvalContext:
    """What the harness is told about one evaluation.

    Attributes:
        seed: random seed for this evaluation (the harness passes it to the candidate).
        timeout_s: wall-clock limit for the candidate's own processes.
        gpu: the value of CUDA_VISIBLE_DEVICES for this slot, or None on CPU.
        hardware: a short description of the slot's hardware.
        scratch: a directory owned by the harness (not the candidate) for its own files.
    """

    seed: int = 0
    timeout_s: float = 60.0
    gpu: str | None = None
    hardware: str = "cpu"
    scratch: Path | None = None

    def env(self) -> dict[str, str]:
        """Environment for the candidate's process: the seed and the slot's GPU."""
        env = {"EVOLVE_SEED": str(self.seed), "PYTHONHASHSEED": str(self.seed)}
        if self.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.gpu
        return env


@runtime_checkable
class Fitness(Protocol):
    """Scores a candidate. Implementations must be picklable (they travel to workers)."""

    objective: Objective
    descriptors: Sequence[Descriptor]

    def evaluate(self, workdir: Path, ctx: EvalContext) -> Evaluation: ...


@dataclass(frozen=True, kw_only=True)
class Stage:
    """One step of a cascade: cheap checks first; a candidate stops at the first it fails."""

    name: str
    run: Callable[[Path, EvalContext], Evaluation]


@dataclass(frozen=True, kw_only=True)
class Benchmark:
    """A problem to evolve: the seed program, what may change, the task text and the fitness.

    Attributes:
        name: short name shown in logs and run directories.
        fitness: the scorer.
        seed_dir: directory holding the seed program's files (all of them are copied).
        editable: glob patterns of files operators may change; others are read-only.
        task: the problem statement shown to LLM operators (TASK.md).
        harness_files: files whose content defines the measurement; hashed per run.
        timeout_s: per-evaluation wall-clock limit handed to the fitness.
        gpus: GPUs one evaluation needs (0 on CPU).
    """

    name: str
    fitness: Fitness
    seed_dir: Path
    editable: tuple[str, ...] = ("*.py",)
    task: str = ""
    harness_files: tuple[Path, ...] = ()
    timeout_s: float = 60.0
    gpus: int = 0

    def seed_files(self) -> dict[str, str]:
        """The seed program as {relative path: text}."""
        if not self.seed_dir.is_dir():
            raise FileNotFoundError(
                f"benchmark {self.name!r}: seed directory {self.seed_dir} does not exist"
            )
        files = {
            str(path.relative_to(self.seed_dir)): path.read_text()
            for path in sorted(self.seed_dir.rglob("*"))
            if path.is_file() and "__pycache__" not in path.parts
        }
        if not files:
            raise FileNotFoundError(
                f"benchmark {self.name!r}: seed directory {self.seed_dir} is empty"
            )
        return files

    def is_editable(self, path: str) -> bool:
        return any(fnmatch.fnmatch(path, pattern) for pattern in self.editable)

    def harness_hash(self) -> str:
        """SHA-256 over the harness files' paths and bytes; changes when the measurement does."""
        digest = hashlib.sha256()
        for path in sorted(self.harness_files):
            digest.update(str(path.name).encode())
            digest.update(path.read_bytes())
        return digest.hexdigest()


def write_files(files: Files, workdir: Path) -> None:
    """Materialise a candidate's files under ``workdir``, refusing paths that escape it."""
    root = workdir.resolve()
    for rel, text in files.items():
        target = (root / rel).resolve()
        if not target.is_relative_to(root):
            raise ValueError(f"candidate file {rel!r} escapes the working directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def evaluate_safely(fitness: Fitness, workdir: Path, ctx: EvalContext) -> Evaluation:
    """Run a fitness (and its cascade, if it declares ``stages``) so that nothing escapes.

    A fitness that raises becomes an ERROR evaluation with the traceback in artifacts.
    With stages, each runs in order; the first non-OK one ends the cascade, and the
    metrics of all stages run so far are merged into the returned evaluation.
    """
    start = time.monotonic()
    stages: Sequence[Stage] = getattr(fitness, "stages", None) or (
        Stage(name="full", run=fitness.evaluate),
    )
    metrics: dict[str, Any] = {}
    result: Evaluation | None = None
    for stage in stages:
        try:
            result = stage.run(workdir, ctx)
        except Exception as exc:  # the harness itself failed: record, never crash the run
            result = Evaluation(
                status=EvalStatus.ERROR,
                artifacts={
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()[-8000:],
                },
            )
        metrics.update(result.metrics)
        result = replace(result, stage=stage.name, metrics=dict(metrics))
        if not result.ok:
            break
    assert result is not None
    return replace(
        result,
        wall_s=time.monotonic() - start,
        seeds=result.seeds or (ctx.seed,),
        hardware=ctx.hardware,
    )


def sandbox_failure(result: Result, what: str = "candidate") -> Evaluation | None:
    """The Evaluation for a sandboxed run that timed out, crashed or left processes; else None."""
    if result.timed_out:
        return Evaluation(
            status=EvalStatus.TIMEOUT,
            artifacts={"error": f"{what} timed out", "output": result.tail()},
        )
    if result.returncode != 0:
        return Evaluation(
            status=EvalStatus.ERROR,
            artifacts={
                "error": f"{what} exited with status {result.returncode}",
                "output": result.tail(),
            },
        )
    if result.leftover:
        return Evaluation(
            status=EvalStatus.REJECTED,
            artifacts={
                "error": f"{what} left {result.leftover} process(es) running after it exited (killed)"
            },
        )
    return None


def one_sided_pvalue(
    samples: Sequence[float], threshold: float, *, alternative: str = "less"
) -> float:
    """p-value of a one-sample t-test that the mean of ``samples`` is below (or above) ``threshold``.

    Matches ``scipy.stats.ttest_1samp(samples, threshold, alternative=...).pvalue``; a
    single sample or zero spread gives 0.0 or 1.0 by which side of the threshold it is.
    """
    from scipy import stats

    values = [float(v) for v in samples]
    if len(values) < 2 or max(values) == min(values):
        mean = sum(values) / len(values)
        below = mean < threshold if alternative == "less" else mean > threshold
        return 0.0 if below else 1.0
    pvalue = float(stats.ttest_1samp(values, threshold, alternative=alternative).pvalue)
    return pvalue if math.isfinite(pvalue) else 1.0
