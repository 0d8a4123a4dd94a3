"""The nanochat fitness's quick stages before the full run: a local check and a short training run.

``evolve.benchmarks.nanochat.layered`` runs the comparisons in the harness's own process; the numbers come from
the same kind of sandboxed harness processes as the full run's, with the training data only:
``probe`` (with its child ``probe_worker``) for the local check, and the training
``supervisor`` with a step limit for the short run. Which stages run is the ``layered``
config node (``LayeredSettings``).

The seed's references (its local-check values, its short-run loss band over
``CALIBRATION_SEEDS``) are measured once and stored under the data directory
(``calibration/``, which candidates can neither read nor write), keyed by everything that
decides them: the seed's files, the scale, the steps and seeds, the hardware, the harness's
code and torch's version. Every worker process of a run, and later runs on the same
machine, read them instead of measuring again; the first process to need one measures it
while the others wait on a lock.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolve.harness import once, phases
from evolve.harness.as_found import as_found
from evolve.harness.fitness import EvalContext, Stage, write_files
from evolve.harness.hashing import files_digest, harness_modules
from evolve.harness.protocol import failed
from evolve.types import EvalStatus, Evaluation, Files

from . import ahead
from .layered import LocalCheck, LossBand, ShortRun, cascade
from .scales import Scale

if TYPE_CHECKING:
    from .fitness import NanochatFitness

# The short run's steps when the config leaves them unset, from what a short run costs next
# to a full run (README, "Quick stages"): on one GPU ~12%, checked past the seed's 20-step
# warm-up; on the CPU scale ~20%, for candidates that the built-in operators rarely break.
SHORT_RUN_STEPS = {"nanochat": 30, "cpu": 0}
CALIBRATION_SEEDS = (0, 1, 2)
GRADIENTS = ("grad_norm_vocab", "grad_norm_body")


@dataclass(frozen=True, kw_only=True)
class LayeredSettings:
    """The ``layered`` config node: the quick stages that run before the full run.

    Attributes:
        local_check: run the local check (the fresh model on fixed training rows).
        short_run_steps: steps of the short run (0: none).
    """

    local_check: bool = True
    short_run_steps: int = 0

    @classmethod
    def of(cls, values: Mapping[str, Any] | None, scale: Scale) -> LayeredSettings:
        """From the config node; ``short_run_steps`` unset or null means the scale's default."""
        values = dict(values or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown nanochat layered settings {unknown}; known: {sorted(known)}")
        steps = values.get("short_run_steps")
        steps = SHORT_RUN_STEPS.get(scale.name, 0) if steps is None else int(steps)
        if steps < 0:
            raise ValueError(
                f"layered.short_run_steps must be 0 (no short run) or more, got {steps}"
            )
        return cls(local_check=bool(values.get("local_check", True)), short_run_steps=steps)

    def describe(self) -> str:
        steps = (
            f"a short run of {self.short_run_steps} steps"
            if self.short_run_steps
            else "no short run"
        )
        return f"{'a local check' if self.local_check else 'no local check'}, {steps}"


@dataclass(frozen=True)
class LocalProbe:
    """The local check's probe: the named values of the candidate's fresh model, or a failed Evaluation."""

    fitness: NanochatFitness

    def __call__(self, workdir: Path, ctx: EvalContext) -> dict | Evaluation:
        """Phases: ``local_check`` (the harness process's start and the rows), then, from its
        report, ``local_check_worker`` (the worker's start, imports, model, forward and
        backward passes) and ``local_check_verdict`` (the harness's numbers, the comparison)."""
        scale = self.fitness.scale
        job = {
            **self.fitness.program_settings(workdir, ctx),
            "entry": "train.py",
            "limit_s": scale.startup_limit_s,
        }
        phases.mark("local_check")  # again for the seed's reference, when measured first
        result = self.fitness.run_harness(
            "local check", workdir, ctx, job, limit_s=probe_limit_s(scale)
        )
        if isinstance(result, Evaluation):
            return result
        if result["status"] != "ok":
            return failed(result, probe_log=result.get("log_tail", ""))
        marks = result["marks"]
        phases.mark_each(
            [("local_check_worker", marks["worker"]), ("local_check_verdict", marks["answered"])]
        )
        return result["values"]


@dataclass(frozen=True)
class ShortTraining:
    """The short run's trainer: the loss of each of the first ``steps`` steps, or a failed Evaluation."""

    fitness: NanochatFitness

    def __call__(self, workdir: Path, ctx: EvalContext, steps: int) -> list[float] | Evaluation:
        # on real rows, in the full run's folder: the full run must not start from what it leaves
        with as_found(Path(workdir)):
            result = self.fitness.train(workdir, ctx, max_steps=steps)
        if isinstance(result, Evaluation):
            return result
        train_log = result.get("log_tail", "")
        losses = result.get("losses") or []
        if result["status"] != "ok":
            return failed(result, train_log=train_log, losses=str(losses))
        if None in losses:
            return Evaluation(
                status=EvalStatus.INVALID,
                artifacts={
                    "train_log": train_log,
                    "error": f"train.py reported no loss at step {losses.index(None)}: pass it as "
                    "clock.step(tokens=..., loss=loss.item())",
                },
            )
        return losses


def reference_key(
    fitness: NanochatFitness, seed_files: Files, ctx: EvalContext, **what: Any
) -> str:
    """A digest of everything that decides a seed reference (``what`` names the stage's own settings)."""
    code = harness_modules(type(fitness).__module__)  # what the harness hash covers
    scale = {k: str(v) for k, v in dataclasses.asdict(fitness.scale).items()}
    facts = {
        "seed": dict(sorted(seed_files.items())),
        "scale": scale,
        "data": str(fitness.dataset_root),
        "hardware": ctx.hardware,
        "torch": importlib.metadata.version("torch"),
        "harness": files_digest(code),
        **what,
    }
    return once.key(facts)


@dataclass(kw_only=True)
class StoredLocalCheck(LocalCheck):
    """The local check with the seed's values measured once per machine and harness (module docstring)."""

    fitness: NanochatFitness = field(repr=False, compare=False)

    def __call__(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        """On a GPU, the training harness for the next stage starts first (``prepare_training``):
        its program imports torch while the probe runs."""
        if self.fitness.starts_ahead:
            self.fitness.prepare_training(workdir, ctx)
        verdict = super().__call__(workdir, ctx)
        if not verdict.ok:
            ahead.drop()
        return verdict

    def reference(self, ctx: EvalContext) -> Mapping[str, Any]:
        if self._reference is None:
            key = reference_key(self.fitness, self.seed_files, ctx, stage=self.name)
            path = self.fitness.calibration_dir / f"local-check-{key}.json"
            self._reference = once.stored(path, lambda: dict(LocalCheck.reference(self, ctx)))
        return self._reference


@dataclass(kw_only=True)
class StoredShortRun(ShortRun):
    """The short run with the seed's loss band measured once per machine and harness (module docstring)."""

    fitness: NanochatFitness = field(repr=False, compare=False)

    def band(self, ctx: EvalContext) -> LossBand:
        if self._band is None:
            key = reference_key(
                self.fitness, self.seed_files, ctx, steps=self.steps, seeds=list(self.seeds)
            )
            path = self.fitness.calibration_dir / f"short-run-{key}.json"
            self._band = LossBand.from_json(
                once.stored(path, lambda: ShortRun.band(self, ctx).to_json())
            )
        return self._band


@dataclass(frozen=True)
class CacheWarmup:
    """The stage that fills the compile cache (``compile_cache``) once per cache and seed program.

    The harness trains the seed program, its own code, for its untimed steps and one more
    with the cache writable, so that torch.compile's and Triton's compiled kernels of the
    seed are there when candidates, which only read the cache, start. The first evaluation
    to need it runs it (the others wait on the lock, then read the record); it never fails a
    candidate: a seed that does not train leaves the cache as it is.
    """

    fitness: NanochatFitness

    def __call__(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        fitness = self.fitness
        seed_files = {p.name: p.read_text() for p in sorted(fitness.scale.seed_dir.glob("*.py"))}
        key = reference_key(fitness, seed_files, ctx, stage="cache_warmup")

        def warm() -> dict:
            with tempfile.TemporaryDirectory(prefix="nanochat-warmup-", dir=ctx.scratch) as tmp:
                write_files(seed_files, Path(tmp))
                steps = fitness.scale.untimed_steps + 1
                verdict = fitness.train(Path(tmp), ctx, max_steps=steps, warming=True)
            if isinstance(verdict, Evaluation):
                return {
                    "status": verdict.status.value,
                    "reason": verdict.artifacts.get("error", ""),
                }
            return {"status": verdict["status"], "startup_s": verdict["startup_s"]}

        record = once.stored(Path(fitness.compile_cache) / f"warmed-{key}.json", warm)
        warmed = int(record["status"] == "ok")  # as the local check: a passed stage scores 0.0
        return Evaluation(status=EvalStatus.OK, fitness=0.0, metrics={"cache_warmup_ok": warmed})


def probe_limit_s(scale: Scale) -> float:
    """Wall limit of the local check's sandbox."""
    return scale.startup_limit_s + 30.0


def build(fitness: NanochatFitness, settings: LayeredSettings) -> list[Stage]:
    """The fitness's stages: the quick checks ``settings`` asks for, then the full run."""
    seed_files = {
        path.name: path.read_text() for path in sorted(fitness.scale.seed_dir.glob("*.py"))
    }
    checks: list[LocalCheck | ShortRun | Stage] = []
    if fitness.compile_cache:
        checks.append(Stage(name="cache_warmup", run=CacheWarmup(fitness)))
    if settings.local_check:
        checks.append(
            StoredLocalCheck(
                fitness=fitness,
                probe=LocalProbe(fitness),
                seed_files=seed_files,
                zero_keys=("causality",),
                zero_atol=fitness.scale.causal_atol,
                upper_keys=GRADIENTS,
            )
        )
    if settings.short_run_steps:
        checks.append(
            StoredShortRun(
                fitness=fitness,
                train=ShortTraining(fitness),
                seed_files=seed_files,
                steps=settings.short_run_steps,
                seeds=CALIBRATION_SEEDS,
            )
        )
    return cascade(*checks, full=Stage(name="full", run=fitness.evaluate))


def time_limit_s(scale: Scale, settings: LayeredSettings) -> float:
    """The most the quick stages add to one evaluation (the first to need the seed's references measures them)."""
    local = 2 * probe_limit_s(scale) if settings.local_check else 0.0
    short = (len(CALIBRATION_SEEDS) + 1) * scale.train_limit_s if settings.short_run_steps else 0.0
    return local + short
