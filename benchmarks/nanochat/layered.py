"""Layered checks for training code: a quick local check, a short run against the seed's band, then the full run.

A benchmark that trains a model declares ``stages`` (``evolve.harness.fitness.Stage``) so that a
broken candidate costs seconds, not a full training run:

1. ``LocalCheck``: the harness runs the candidate's model on fixed inputs (a probe of its
   own, in the sandbox) and gets back named tensors: outputs, the loss, gradient norms per
   parameter group. They must be finite, have the seed's shapes, and stay within a factor
   of the seed's scale; a causality probe may report how much earlier positions changed
   when later tokens changed, which must be ~0.
2. ``ShortRun``: the harness trains the candidate for a few steps and gets the loss
   trajectory. The seed program, trained the same way with several seeds, defines a band
   (mean +/- k standard deviations per step, plus a relative slack); a candidate whose loss
   is NaN, or above the band's upper edge at the last checked step, is stopped there.
3. The full run: the benchmark's own ``evaluate``.

The probes are the benchmark's (they know how to build and train its model); this module
owns the comparisons, the band's calibration and the stage bookkeeping. The seed's
references are measured lazily, once per process, through the same probe, so they match
the hardware the candidate runs on. Everything here is picklable (fitnesses travel to
worker processes).
"""

from __future__ import annotations

import math
import statistics
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolve.harness.fitness import EvalContext, Stage, write_files
from evolve.types import EvalStatus, Evaluation, Files

Probe = Callable[[Path, EvalContext], "Mapping[str, Any] | Evaluation"]
"""Runs the candidate in ``workdir`` (sandboxed) and returns named values, or a failed Evaluation."""


def _flat(value: Any) -> list[float]:
    """Numbers of a scalar, a (nested) list or anything with ``tolist()`` (numpy, torch)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, int | float):
        return [float(value)]
    if isinstance(value, list | tuple):
        return [x for item in value for x in _flat(item)]
    raise TypeError(f"expected numbers, got {type(value).__name__}")


def _shape(value: Any) -> tuple[int, ...]:
    if hasattr(value, "shape"):
        return tuple(int(d) for d in value.shape)
    if isinstance(value, list | tuple):
        return (len(value), *(_shape(value[0]) if value else ()))
    return ()


def _rms(values: Sequence[float]) -> float:
    return math.sqrt(math.fsum(v * v for v in values) / len(values)) if values else 0.0


def compare_tensors(
    candidate: Mapping[str, Any],
    reference: Mapping[str, Any],
    *,
    scale_factor: float = 10.0,
    zero_keys: Sequence[str] = (),
    zero_atol: float = 1e-5,
    upper_keys: Sequence[str] = (),
) -> str | None:
    """Why ``candidate``'s probe values are wrong compared with the seed's ``reference``, or None.

    Every reference key must be present with the same shape, all values finite, and each
    value's root-mean-square within ``scale_factor`` of the reference's (both ways; a zero
    reference allows only ~zero). Keys in ``upper_keys`` are bounded above only (a gradient
    norm may vanish, e.g. behind a zero-initialised layer, but must not explode). Keys in
    ``zero_keys`` (e.g. a causality probe's change of earlier logits) must stay within
    ``zero_atol`` of zero.
    """
    for key, ref in reference.items():
        if key not in candidate:
            return f"local check: the probe returned no {key!r} (got {sorted(candidate)})"
        value = candidate[key]
        if _shape(value) != _shape(ref):
            return f"local check: {key} has shape {_shape(value)}, the seed's has {_shape(ref)}"
        numbers = _flat(value)
        if not all(math.isfinite(v) for v in numbers):
            return f"local check: {key} has non-finite values (NaN or inf) on the fixed inputs"
        got, want = _rms(numbers), _rms(_flat(ref))
        if key in zero_keys:
            if max((abs(v) for v in numbers), default=0.0) > zero_atol:
                return f"local check: {key} is {max(abs(v) for v in numbers):.3g}, must be ~0 (<= {zero_atol})"
            continue
        if want == 0.0:
            if got > zero_atol:
                return f"local check: {key} has scale {got:.3g} where the seed's is 0"
        elif key in upper_keys and got > want * scale_factor:
            return (
                f"local check: {key} has scale {got:.3g}, the seed's is {want:.3g} "
                f"(allowed: at most x{scale_factor:g})"
            )
        elif key not in upper_keys and not want / scale_factor <= got <= want * scale_factor:
            return (
                f"local check: {key} has scale {got:.3g}, the seed's is {want:.3g} "
                f"(allowed: within x{scale_factor:g})"
            )
    for key in zero_keys:
        if key not in reference and key in candidate:
            values = _flat(candidate[key])
            worst = max((abs(v) for v in values), default=0.0)
            if not all(math.isfinite(v) for v in values) or worst > zero_atol:
                return f"local check: {key} is {worst:.3g}, must be ~0 (<= {zero_atol})"
    return None


@dataclass(frozen=True, kw_only=True)
class LossBand:
    """The seed program's loss per checked step over several seeds: mean and standard deviation.

    Attributes:
        steps: the training steps checked (indices into a trajectory).
        mean: mean loss of the seed at each step.
        sd: standard deviation over seeds at each step (0 with one seed).
    """

    steps: tuple[int, ...]
    mean: tuple[float, ...]
    sd: tuple[float, ...]

    @classmethod
    def from_trajectories(cls, runs: Sequence[Sequence[float]], steps: Sequence[int]) -> LossBand:
        """The band of ``runs`` (one loss trajectory per seed) at ``steps``."""
        if not runs:
            raise ValueError("a loss band needs at least one trajectory")
        short = [len(r) for r in runs if len(r) <= max(steps)]
        if short:
            raise ValueError(f"trajectories of lengths {short} do not reach step {max(steps)}")
        mean, sd = [], []
        for step in steps:
            values = [float(r[step]) for r in runs]
            if not all(math.isfinite(v) for v in values):
                raise ValueError(f"the seed's loss at step {step} is not finite: {values}")
            mean.append(statistics.fmean(values))
            sd.append(statistics.stdev(values) if len(values) > 1 else 0.0)
        return cls(steps=tuple(steps), mean=tuple(mean), sd=tuple(sd))

    def upper(self, index: int, *, k_sigma: float, rel_slack: float) -> float:
        """The highest loss allowed at ``steps[index]``."""
        return self.mean[index] + k_sigma * self.sd[index] + rel_slack * abs(self.mean[index])

    def check(
        self, losses: Sequence[float], *, k_sigma: float = 4.0, rel_slack: float = 0.05
    ) -> str | None:
        """Why the trajectory ``losses`` leaves the band, or None.

        Any non-finite loss up to the last checked step fails; so does a loss above the
        band's upper edge at the last checked step (earlier steps are too noisy to judge
        alone: a candidate may start slower and catch up).
        """
        last = self.steps[-1]
        if len(losses) <= last:
            return f"short run: {len(losses)} losses reported, the check needs {last + 1}"
        for step, loss in enumerate(losses[: last + 1]):
            if not math.isfinite(float(loss)):
                return f"short run: the loss is {loss} at step {step} (diverged)"
        limit = self.upper(len(self.steps) - 1, k_sigma=k_sigma, rel_slack=rel_slack)
        if float(losses[last]) > limit:
            return (
                f"short run: loss {float(losses[last]):.4f} at step {last} is above the seed's band "
                f"(mean {self.mean[-1]:.4f}, sd {self.sd[-1]:.4f}, limit {limit:.4f}); the full run "
                "would not be competitive"
            )
        return None

    def to_json(self) -> dict[str, Any]:
        return {"steps": list(self.steps), "mean": list(self.mean), "sd": list(self.sd)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LossBand:
        return cls(steps=tuple(data["steps"]), mean=tuple(data["mean"]), sd=tuple(data["sd"]))


def _seed_workdir(seed_files: Files) -> tempfile.TemporaryDirectory:
    tmp = tempfile.TemporaryDirectory(prefix="evolve-layered-seed-")
    write_files(seed_files, Path(tmp.name))
    return tmp


def _failed(result: Evaluation, stage: str) -> Evaluation:
    error = result.artifacts.get("error", str(result.status))
    return Evaluation(
        status=result.status,
        artifacts={**result.artifacts, "error": f"{stage}: {error}"},
    )


@dataclass(kw_only=True)
class LocalCheck:
    """Stage 1: the candidate's model on fixed inputs against the seed's (``compare_tensors``).

    Args:
        probe: runs a program's model on fixed inputs in the sandbox; returns named values.
        seed_files: the seed program (its probe values are the reference, measured once).
        scale_factor: allowed ratio of scales (root-mean-square) between candidate and seed.
        zero_keys: values that must be ~0 (e.g. ``"causality"``: how much earlier outputs
            moved when later inputs changed).
        zero_atol: the tolerance of ``zero_keys``.
        upper_keys: values bounded above only (e.g. gradient norms, which a zero-initialised
            layer may make vanish at the start).
        name: the stage's name in the evaluations table.
    """

    probe: Probe
    seed_files: Files
    scale_factor: float = 10.0
    zero_keys: tuple[str, ...] = ()
    zero_atol: float = 1e-5
    upper_keys: tuple[str, ...] = ()
    name: str = "local_check"
    _reference: Mapping[str, Any] | None = field(default=None, init=False, repr=False)

    def reference(self, ctx: EvalContext) -> Mapping[str, Any]:
        """The seed's probe values (measured on first use in this process)."""
        if self._reference is None:
            with _seed_workdir(self.seed_files) as tmp:
                values = self.probe(Path(tmp), ctx)
            if isinstance(values, Evaluation):
                raise RuntimeError(
                    f"the seed program fails the {self.name} probe: {values.artifacts.get('error')}; "
                    "fix the probe or the seed"
                )
            self._reference = {k: v for k, v in values.items() if k not in self.zero_keys}
        return self._reference

    def __call__(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        reference = self.reference(ctx)
        values = self.probe(workdir, ctx)
        if isinstance(values, Evaluation):
            return _failed(values, self.name)
        problem = compare_tensors(
            values,
            reference,
            scale_factor=self.scale_factor,
            zero_keys=self.zero_keys,
            zero_atol=self.zero_atol,
            upper_keys=self.upper_keys,
        )
        if problem is not None:
            return Evaluation(status=EvalStatus.INVALID, artifacts={"error": problem})
        return Evaluation(status=EvalStatus.OK, fitness=0.0, metrics={f"{self.name}_ok": 1})

    def stage(self) -> Stage:
        return Stage(name=self.name, run=self)


@dataclass(kw_only=True)
class ShortRun:
    """Stage 2: a few training steps; the loss must stay inside the seed's calibrated band.

    Args:
        train: trains a program for ``steps`` steps in the sandbox with the context's seed and
            returns its loss per step (or a failed Evaluation).
        seed_files: the seed program.
        steps: training steps of the short run.
        check_steps: steps at which the band is kept (default: the last one).
        seeds: evaluation seeds of the seed program's calibration runs.
        k_sigma: band half-width in the seed's standard deviations.
        rel_slack: extra allowance, relative to the seed's mean loss (covers calibration
            with few seeds and hardware noise).
        name: the stage's name.
    """

    train: Callable[[Path, EvalContext, int], Sequence[float] | Evaluation]
    seed_files: Files
    steps: int = 20
    check_steps: tuple[int, ...] = ()
    seeds: tuple[int, ...] = (0, 1, 2)
    k_sigma: float = 4.0
    rel_slack: float = 0.05
    name: str = "short_run"
    _band: LossBand | None = field(default=None, init=False, repr=False)

    def band(self, ctx: EvalContext) -> LossBand:
        """The seed's band (calibrated on first use in this process over ``seeds``)."""
        if self._band is None:
            runs = []
            with _seed_workdir(self.seed_files) as tmp:
                for seed in self.seeds:
                    losses = self.train(Path(tmp), _with_seed(ctx, seed), self.steps)
                    if isinstance(losses, Evaluation):
                        raise RuntimeError(
                            f"the seed program fails the {self.name} stage with seed {seed}: "
                            f"{losses.artifacts.get('error')}; fix the short-run probe or the seed"
                        )
                    runs.append(list(losses))
            steps = self.check_steps or (self.steps - 1,)
            self._band = LossBand.from_trajectories(runs, steps)
        return self._band

    def __call__(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        band = self.band(ctx)
        losses = self.train(workdir, ctx, self.steps)
        if isinstance(losses, Evaluation):
            return _failed(losses, self.name)
        problem = band.check(losses, k_sigma=self.k_sigma, rel_slack=self.rel_slack)
        last = band.steps[-1]
        metrics = {f"{self.name}_loss": float(losses[last])} if len(losses) > last else {}
        if problem is not None:
            return Evaluation(
                status=EvalStatus.INVALID, metrics=metrics, artifacts={"error": problem}
            )
        metrics[f"{self.name}_band_upper"] = band.upper(
            len(band.steps) - 1, k_sigma=self.k_sigma, rel_slack=self.rel_slack
        )
        return Evaluation(status=EvalStatus.OK, fitness=float(losses[last]), metrics=metrics)

    def stage(self) -> Stage:
        return Stage(name=self.name, run=self)


def _with_seed(ctx: EvalContext, seed: int) -> EvalContext:
    from dataclasses import replace

    return replace(ctx, seed=seed)


def cascade(*stages: LocalCheck | ShortRun | Stage, full: Stage) -> list[Stage]:
    """The stage list a fitness exposes as ``stages``: the quick checks, then the full run."""
    out = [s if isinstance(s, Stage) else s.stage() for s in stages]
    return [*out, full]
