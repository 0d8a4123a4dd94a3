"""The fitness contract: what a benchmark implements, and how it is run safely.

Benchmarks import only this module and ``evolve.types``. A fitness scores a candidate's
files in a working directory; it runs the candidate's code through ``run_sandboxed`` and
computes the score itself from outputs the candidate cannot fake.
"""

from __future__ import annotations

import fnmatch
import math
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from evolve.harness import phases
from evolve.harness.hashing import files_digest, harness_modules
from evolve.sandbox.process import Limits, Policy, Result, Started
from evolve.sandbox.process import run as run_sandboxed
from evolve.sandbox.process import start as start_sandboxed
from evolve.types import (
    DISK_FAULTS,
    Descriptor,
    EvalStatus,
    Evaluation,
    Files,
    InfrastructureFault,
    Objective,
)

__all__ = [
    "Benchmark",
    "EvalContext",
    "Fitness",
    "Limits",
    "Policy",
    "Result",
    "Stage",
    "Started",
    "evaluate_safely",
    "read_output",
    "run_sandboxed",
    "start_sandboxed",
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
        strict: True when the auditor re-evaluates a candidate its static detectors flagged
            (``evolve.archive.referee.Auditor``) before it may become the run's best. A fitness may
            then add checks it skips otherwise: more randomised probes, more positions or
            rows checked, a second look at outputs. It must never reveal the mode to the
            candidate (a program that can tell would behave). Default False.
    """

    seed: int = 0
    timeout_s: float = 60.0
    gpu: str | None = None
    hardware: str = "cpu"
    scratch: Path | None = None
    strict: bool = False

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
        prescribed: dotted names of calls the task tells programs to make (circle packing:
            ``time.process_time``); the auditor's static rules do not flag them.
        shown_metrics: the metrics prompts show (those meaningful to the model); empty:
            every metric but the harness's own phase timings (``time_<phase>``).
    """

    name: str
    fitness: Fitness
    seed_dir: Path
    editable: tuple[str, ...] = ("*.py",)
    task: str = ""
    harness_files: tuple[Path, ...] = ()
    timeout_s: float = 60.0
    gpus: int = 0
    prescribed: tuple[str, ...] = ()
    shown_metrics: tuple[str, ...] = ()

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

    def harness_paths(self) -> list[Path]:
        """Every file that defines the measurement: ``harness_files`` plus, computed, each module
        the fitness's module imports or starts (``python -m``) inside ``evolve`` and its own package."""
        module = type(self.fitness).__module__
        found = harness_modules(module) if module not in ("__main__", "builtins") else []
        return sorted({*(p.resolve() for p in self.harness_files), *found})

    def harness_hash(self) -> str:
        """SHA-256 over the harness's files (``harness_paths``); changes when the measurement does."""
        return files_digest(self.harness_paths(), root=Path(__file__).resolve().parent.parent)


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

    Where the wall time went is in the metrics as ``time_<phase>`` seconds adding up to
    ``wall_s`` (``evolve.harness.phases``): a stage is one phase named after it unless the
    fitness marks finer ones; "harness" is evolve's own bookkeeping.
    """
    start = time.monotonic()
    stages: Sequence[Stage] = getattr(fitness, "stages", None) or (
        Stage(name="full", run=fitness.evaluate),
    )
    metrics: dict[str, Any] = {}
    result: Evaluation | None = None
    with phases.timeline("harness", start) as line:
        for stage in stages:
            phases.mark(phases.slug(stage.name))
            try:
                result = _checked(stage.run(workdir, ctx), fitness)
            except OSError as exc:
                if exc.errno in DISK_FAULTS:  # the machine's fault: the candidate is not failed
                    raise InfrastructureFault(
                        f"the disk failed the evaluation ({exc}); free space (or make the folder "
                        "writable) and resume the run: the candidate is evaluated again"
                    ) from exc
                result = _harness_error(exc)
            except Exception as exc:  # the harness itself failed: record, never crash the run
                result = _harness_error(exc)
            phases.mark("harness")
            metrics.update(result.metrics)
            result = replace(result, stage=stage.name, metrics=dict(metrics))
            if not result.ok:
                break
        assert result is not None
        if result.ok:
            result = _with_declared_descriptors(fitness, result)
        end = time.monotonic()
    return replace(
        result,
        metrics={**result.metrics, **phases.metrics(line.seconds(end))},
        wall_s=end - start,
        seeds=result.seeds or (ctx.seed,),
        hardware=ctx.hardware,
    )


def _harness_error(exc: Exception) -> Evaluation:
    """The ERROR evaluation of a fitness that raised ``exc`` (called while it is handled)."""
    return Evaluation(
        status=EvalStatus.ERROR,
        artifacts={
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc()[-8000:],
        },
    )


def _checked(result: Any, fitness: Fitness) -> Evaluation:
    """``result`` if it is an Evaluation (whose own checks need an OK one's fitness to be a finite
    number), else an ERROR evaluation naming what the fitness returned."""
    if not isinstance(result, Evaluation):
        return Evaluation(
            status=EvalStatus.ERROR,
            artifacts={
                "error": f"the fitness {type(fitness).__name__} returned a {type(result).__name__} "
                f"({str(result)[:200]}), not an Evaluation: fix its evaluate() to return "
                "evolve.Evaluation(...)"
            },
        )
    return result


def _with_declared_descriptors(fitness: Fitness, result: Evaluation) -> Evaluation:
    """``result``, or an ERROR when it lacks a finite value for a descriptor the fitness declares.

    The archive places a candidate by every declared descriptor, so an OK evaluation without
    one cannot be recorded; failing it here keeps the run going and names the fix.
    """
    values = result.descriptors
    missing = [
        d.name
        for d in fitness.descriptors
        if not isinstance(values.get(d.name), int | float) or not math.isfinite(values[d.name])
    ]
    if not missing:
        return result
    declared = ", ".join(d.name for d in fitness.descriptors)
    return replace(
        result,
        status=EvalStatus.ERROR,
        fitness=None,
        artifacts={
            **result.artifacts,
            "error": f"the fitness {type(fitness).__name__} returned no finite value for descriptor(s) "
            f"{missing} (it declares {declared}; got {dict(values)}): fix its evaluate() to fill "
            "Evaluation.descriptors",
        },
    )


def sandbox_failure(result: Result, what: str = "candidate") -> Evaluation | None:
    """The Evaluation for a sandboxed run that tampered, timed out, crashed or left processes; else None."""
    if result.modified:
        return Evaluation(
            status=EvalStatus.REJECTED,
            artifacts={
                "error": f"{what} modified read-only harness files: {', '.join(map(str, result.modified))}"
            },
        )
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


def read_output(path: Path, *, limit_bytes: int = 64 << 20) -> str:
    """Read a file the candidate wrote, refusing what could hang or fool the harness.

    The file must be a regular file, not a symbolic link (a link to ``/dev/zero`` would make
    the harness read forever; a link to a file elsewhere would have the harness read it on
    the candidate's behalf), of at most ``limit_bytes`` bytes.

    Raises:
        FileNotFoundError: there is no such file.
        ValueError: it is a link, not a regular file, too large, or not UTF-8.
    """
    import errno
    import os
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(f"{path.name} is a symbolic link; write a regular file") from exc
        raise
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise ValueError(f"{path.name} is not a regular file; write a regular file")
        data = handle.read(limit_bytes + 1)
    if len(data) > limit_bytes:
        raise ValueError(f"{path.name} is larger than {limit_bytes} bytes")
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path.name} is not UTF-8 text ({exc})") from exc
