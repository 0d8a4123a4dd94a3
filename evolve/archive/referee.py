"""Re-evaluation inside a run: noise-aware selection (``Referee``) and the auditor stage (``Auditor``).

The statistics live in ``evolve.archive.noise``; this module is the part of the loop that asks for
more samples. The search gives it a way to evaluate a candidate once more with its k-th
extra seed, and hands it every finished evaluation: ``calibrate`` for the seed program
(``noise.seeds`` samples, side by side on the evaluation slots, each stored at once so a
killed run does not measure it again),
``settle`` for a challenger (more samples while its one-sided test against the cell's
incumbent is close, per ``noise.schedule``, and ``noise.best_seeds`` when its first score
would make it the run's best). The calibration becomes the archive's judge, and the spread of
every program evaluated more than once, pooled, its ``noise_sd``, which a new best must clear
(``Archive.beyond_noise``).

The ``Auditor`` looks at a candidate about to become the run's best: ``evolve.harness.audit``'s
static detectors read what it added to its parent, and, when the run has a model, a
``ReviewDiff`` (``evolve.research.review``) asks it to review the change against the task's
rules (its score and gain beside it). Calls the task prescribes (``Benchmark.prescribed``)
never flag. A candidate flagged by either is evaluated again, strictly
(``EvalContext.strict``) with its next extra seed(s) and the same limits, and promoted only
when that confirms it would still be the best; otherwise it is refused, and keeps its first
score with the decision beside it. A strict evaluation stopped by the wall clock before the
program's own budget was reached (artifact ``limit: wall``) is the machine's fault: it is run
again, ``INFRASTRUCTURE_RETRIES`` times at most, and if it never finishes the candidate is
``unconfirmed``, not refused: not promoted, and not held against it. What later prompts see
of it is only "flagged, then refused" (or unconfirmed): a flag's reasons stay in the audit
record, so no prompt steers models away from what the task prescribes. A review without a
verdict (a malformed answer, a failed call) is recorded and leaves the static verdict alone.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, replace

from evolve.archive import noise as noise_aware
from evolve.archive.grid import Archive
from evolve.archive.statistics import Samples, pooled_sd
from evolve.harness.audit import AuditReport, audit
from evolve.store.database import Store
from evolve.types import Candidate, EdgeRole, EvalStatus, Evaluation, EvolveError, Files

log = logging.getLogger("evolve")

Reevaluate = Callable[[int, Candidate, int], Awaitable[Evaluation]]
"""(slot, candidate, k) -> the candidate's evaluation with its k-th extra seed."""

StrictReevaluate = Callable[[Candidate, int], Awaitable[Evaluation]]
"""(candidate, k) -> its strict evaluation with its k-th extra seed, on a slot it borrows."""

SUSPICIOUS = "suspicious"


@dataclass(frozen=True)
class ModelReview:
    """A model's review of a candidate's change against the task's rules.

    Attributes:
        verdict: ``clean``, ``suspicious`` (counts like a static flag), ``malformed`` (the
            answer did not start with a verdict line) or ``unavailable`` (no answer: the call
            failed or no call may be made); the last two are no verdict.
        reasons: the model's reasons; for no verdict, the answer as given or why there is none.
        model: the model that was asked.
        prompt_hash: the prompt's hash (its call is in ``llm_calls`` under it).
    """

    verdict: str
    reasons: str
    model: str
    prompt_hash: str


ReviewDiff = Callable[[Candidate, Files | None, AuditReport, float, float], Awaitable[ModelReview]]
"""(candidate, its parent's files (None: a seed), the static report, its score, the run's best
it would replace) -> a model's review."""


class Referee:
    """Noise-aware verdicts for one run (see the module docstring).

    Args:
        store: the run's store (extra samples and the calibration are kept there).
        archive: its judge becomes a ``noise.NoiseJudge`` once the seed is calibrated.
        settings: the run's ``noise`` settings (enabled).
        reevaluate: evaluates a candidate with its k-th extra seed.
        sample_seed: the evaluation seed of a candidate's k-th extra sample.
        slots: evaluation slots the seed's calibration samples may use at once.
    """

    def __init__(
        self,
        *,
        store: Store,
        archive: Archive,
        settings: noise_aware.NoiseSettings,
        reevaluate: Reevaluate,
        sample_seed: Callable[[Candidate, int], int],
        slots: int = 1,
    ) -> None:
        self.store = store
        self.archive = archive
        self.settings = settings
        self.reevaluate = reevaluate
        self.sample_seed = sample_seed
        self.slots = max(1, slots)
        self.calibration: noise_aware.Calibration | None = None
        self._repeated: dict[str, Samples] = {}  # programs evaluated more than once

    async def calibrate(self, candidate: Candidate, first: Evaluation) -> Evaluation:
        """Evaluate the seed program with ``noise.seeds`` seeds; return its verdict.

        The extra samples run side by side, one per evaluation slot (the workers have not
        started yet), in waves; a failed sample stops the waves after it.
        """
        stored = {
            s.seeds[0]: s for s in noise_aware.reevaluations(self.store, candidate.id) if s.seeds
        }
        samples = {0: first}
        missing = []
        for k in range(1, self.settings.seeds):
            sample = stored.get(self.sample_seed(candidate, k))
            if sample is None:
                missing.append(k)
            else:
                samples[k] = sample
        for start in range(0, len(missing), self.slots):
            if not all(s.ok for s in samples.values()):
                break
            wave = missing[start : start + self.slots]
            log.info(
                "calibrating noise: seed program, seed(s) %s of %d",
                ", ".join(str(k + 1) for k in wave),
                self.settings.seeds,
            )
            results = await asyncio.gather(
                *(self._calibration_sample(slot, candidate, k) for slot, k in enumerate(wave))
            )
            samples.update(zip(wave, results, strict=True))
        ordered = [samples[k] for k in sorted(samples)]
        if all(s.ok for s in ordered):
            self._use(noise_aware.make_calibration(candidate.id, ordered))
            log.info(
                "noise: %s = %.6g +/- %.3g (sd over %d seeds)",
                self.archive.objective.name,
                self.calibration.fitness.mean,
                self.calibration.fitness.sd,
                len(ordered),
            )
        return noise_aware.summarize(
            ordered,
            calibration=self.calibration or noise_aware.make_calibration(candidate.id, [first]),
            settings=self.settings,
            own_calibration=True,
        )

    async def _calibration_sample(self, slot: int, candidate: Candidate, k: int) -> Evaluation:
        """The seed program's k-th extra sample, stored as soon as it is measured."""
        sample = await self.reevaluate(slot, candidate, k)
        # keyed by its first seed on resume: a fitness may report several seeds, a failure none
        sample = replace(sample, seeds=sample.seeds or (self.sample_seed(candidate, k),))
        with self.store.transaction():
            self.store.add_evaluation(candidate.id, replace(sample, stage=noise_aware.REEVALUATION))
        return sample

    def load(self) -> None:
        """Take the calibration a resumed run stored with its seed program."""
        data = self.store.get_state(noise_aware.STATE_KEY)
        if data is None:
            raise EvolveError(
                "noise-aware selection is configured but this run has no calibration of the seed "
                "program (it started without noise.seeds); resume it with its own config or start a new run"
            )
        self._use(noise_aware.Calibration.from_json(data))

    async def settle(
        self, slot: int, candidate: Candidate, first: Evaluation
    ) -> tuple[Evaluation, list[Evaluation]]:
        """Re-evaluate a challenger while it is close to its cell's incumbent; return the verdict and extra samples."""
        assert self.calibration is not None, "calibrate or load before settling challengers"
        judge = self.archive.judge
        assert isinstance(judge, noise_aware.NoiseJudge)
        if not first.ok:
            return first, []
        elite = self.archive.rival(first, candidate.island)
        samples, p = [first], None
        while elite is None and len(samples) < self.settings.new_cell_seeds and samples[-1].ok:
            samples.append(await self.reevaluate(slot, candidate, len(samples)))
        best = self.archive.best()
        if best is not None and self.archive.improves(float(first.fitness), best[1]):  # type: ignore[arg-type]
            while len(samples) < self.settings.best_seeds and samples[-1].ok:
                samples.append(await self.reevaluate(slot, candidate, len(samples)))
        while elite is not None:
            p = judge.pvalue(
                Samples.of([s.fitness for s in samples]), elite.candidate_id, elite.value
            )
            target = noise_aware.next_count(len(samples), p, self.settings)
            if target is None:
                break
            while len(samples) < target and samples[-1].ok:
                samples.append(await self.reevaluate(slot, candidate, len(samples)))
            if not samples[-1].ok:
                break
        verdict = noise_aware.summarize(
            samples, calibration=self.calibration, settings=self.settings, p=p
        )
        if verdict.ok and len(samples) > 1:
            self._repeated[candidate.id] = noise_aware.stored_samples(verdict)
            self.archive.noise_sd = pooled_sd(list(self._repeated.values()))[0]
        return verdict, samples[1:]

    def _use(self, calibration: noise_aware.Calibration) -> None:
        self.calibration = calibration
        self._repeated = {
            calibration.seed_id: calibration.fitness,
            **noise_aware.repeated(self.store),
        }
        self.archive.noise_sd = pooled_sd(list(self._repeated.values()))[0]
        self.archive.judge = noise_aware.NoiseJudge(
            store=self.store,
            objective=self.archive.objective,
            calibration=calibration,
            settings=self.settings,
        )


STRICT = "strict"  # stage of the auditor's strict re-evaluations in the evaluations table
SHOWN_FLAGS = 5  # flags named in a refusal's reason (browse shows them all)
INFRASTRUCTURE_RETRIES = 2  # a strict evaluation the wall clock stopped is run again this often


def infrastructure_timeout(evaluation: Evaluation) -> bool:
    """Whether the wall clock stopped the program before its own budget was reached (the
    fitness says so with the artifact ``limit: wall``): the machine's fault, not the program's."""
    return evaluation.status == EvalStatus.TIMEOUT and evaluation.artifacts.get("limit") == "wall"


@dataclass(frozen=True)
class AuditVerdict:
    """The auditor's verdict on one candidate that was about to become the run's best.

    Attributes:
        report: what the static detectors found in the lines it added to its parent.
        decision: ``clean`` (not flagged), ``promoted`` (flagged, the strict evaluation
            confirmed), ``refused`` or ``unconfirmed`` (the wall clock stopped every strict
            evaluation before the program's budget: not promoted, not held against it).
        reason: why it was refused or unconfirmed (empty otherwise).
        strict: the strict re-evaluations (stored with stage ``strict``).
        review: the model's review (None: no model reviewed it).
    """

    report: AuditReport
    decision: str
    reason: str = ""
    strict: tuple[Evaluation, ...] = ()
    review: ModelReview | None = None

    @property
    def flagged(self) -> bool:
        """True when the static detectors flagged it or the model's review found it suspicious."""
        return self.report.flagged or (
            self.review is not None and self.review.verdict == SUSPICIOUS
        )

    @property
    def strict_fitness(self) -> float | None:
        """The mean fitness of the strict re-evaluations; None unless all ran and were OK."""
        if not self.strict or not all(s.ok for s in self.strict):
            return None
        return math.fsum(float(s.fitness) for s in self.strict) / len(self.strict)  # type: ignore[arg-type]

    def record(self, store: Store, candidate_id: str) -> None:
        """Store the verdict with the candidate (inside the transaction that tells its evaluation)."""
        store.add_audit(
            candidate_id,
            flags=[asdict(flag) for flag in self.report.flags],
            unparsed=self.report.unparsed,
            decision=self.decision,
            reason=self.reason,
            strict_fitness=self.strict_fitness,
            review=None if self.review is None else asdict(self.review),
        )


def flag_summary(verdict: AuditVerdict) -> str:
    """``rule at path:line, ...`` for the first static flags, then the model's verdict if suspicious."""
    flags = verdict.report.flags
    named = [f"{f.rule} at {f.path}:{f.line}" for f in flags[:SHOWN_FLAGS]]
    more = len(flags) - SHOWN_FLAGS
    text = ", ".join(named) + (f" and {more} more" if more > 0 else "")
    review = verdict.review
    if review is not None and review.verdict == SUSPICIOUS:
        text += ("; " if text else "") + f"model review by {review.model}: suspicious"
    return text


class Auditor:
    """The auditor stage of a run (see the module docstring).

    Args:
        store: the run's store (parents' files are read from it).
        archive: the run's archive (its best and its tolerance decide what is a new best).
        reevaluate: evaluates a candidate strictly with its k-th extra seed; it borrows a
            slot itself (the auditor holds none: its model review waits on a model, not a device).
        strict_seeds: strict re-evaluations of a flagged candidate (>= 1).
        review_diff: a model's review of the change (None: static detectors only).
        prescribed: calls the task prescribes (``Benchmark.prescribed``), never flagged.
    """

    def __init__(
        self,
        *,
        store: Store,
        archive: Archive,
        reevaluate: StrictReevaluate,
        strict_seeds: int = 1,
        review_diff: ReviewDiff | None = None,
        prescribed: tuple[str, ...] = (),
    ) -> None:
        self.store = store
        self.archive = archive
        self.reevaluate = reevaluate
        self.strict_seeds = max(1, strict_seeds)
        self.review_diff = review_diff
        self.prescribed = prescribed

    def due(self, candidate: Candidate, evaluation: Evaluation) -> tuple[str, float] | None:
        """The best it would replace when ``candidate`` is about to become the run's best; else None."""
        if candidate.seq == 0 or not evaluation.ok:
            return None
        best = self.archive.best()
        if best is None or not self.archive.improves(float(evaluation.fitness), best[1]):  # type: ignore[arg-type]
            return None
        return best

    def parent_files(self, candidate: Candidate) -> Files | None:
        """The files of the parent its change was made to (None: no parent, audit all of it)."""
        roles = (EdgeRole.MUTATION, EdgeRole.CROSSOVER)
        parent = next((pid for pid, role in candidate.parents if role in roles), None)
        return None if parent is None else self.store.candidate(parent).files

    async def review(
        self, candidate: Candidate, evaluation: Evaluation, *, next_sample: int
    ) -> tuple[Evaluation, AuditVerdict | None]:
        """Audit a candidate about to become the best; return its verdict row and the audit (None: not due).

        ``next_sample``: the first extra seed not yet used (after the referee's samples).
        """
        best = self.due(candidate, evaluation)
        if best is None:
            return evaluation, None
        parent_files = self.parent_files(candidate)
        report = audit(candidate.files, parent_files, prescribed=self.prescribed)
        review = None
        if self.review_diff is not None:
            score = float(evaluation.fitness)  # type: ignore[arg-type]
            review = await self.review_diff(candidate, parent_files, report, score, best[1])
        verdict = AuditVerdict(report=report, decision="clean", review=review)
        if not verdict.flagged:
            return evaluation, verdict
        log.info(
            "auditor: %s would be the new best but is flagged (%s); re-evaluating it strictly",
            candidate.id[:8],
            flag_summary(verdict),
        )
        strict: list[Evaluation] = []
        for k in range(next_sample, next_sample + self.strict_seeds):
            strict.append(await self._strict(candidate, k))
            if not strict[-1].ok:
                break
        verdict = replace(verdict, decision="promoted", strict=tuple(strict))
        confirmed = verdict.strict_fitness
        if confirmed is not None and self.archive.improves(confirmed, best[1]):
            objective = self.archive.objective
            kept = min(float(evaluation.fitness), confirmed, key=objective.oriented)  # type: ignore[arg-type]
            metrics = {**evaluation.metrics, "strict_fitness": confirmed}
            return replace(evaluation, fitness=kept, metrics=metrics), verdict
        decision, told = "refused", "auditor: flagged, then refused"
        if confirmed is None:
            failed = strict[-1]
            error = failed.artifacts.get("error", "")
            detail = f"the strict evaluation with seed {list(failed.seeds)} ended {failed.status}"
            detail += f": {error[:300]}" if error else ""
            if infrastructure_timeout(failed):
                decision = "unconfirmed"
                told = (
                    f"auditor: flagged, then unconfirmed (the wall clock stopped its strict "
                    f"re-evaluation {INFRASTRUCTURE_RETRIES + 1} times before its budget was "
                    "reached: the machine is loaded; not held against the program)"
                )
        else:
            detail = (
                f"strict fitness {confirmed:.6g} does not beat the best {best[1]:.6g} "
                f"(first evaluation: {evaluation.fitness:.6g})"
            )
        reason = f"{told}; flags: {flag_summary(verdict)}; strict re-evaluation: {detail}"
        kept_out = Evaluation(  # its first score stays, with the decision beside it
            status=EvalStatus.REJECTED,
            fitness=evaluation.fitness,
            metrics=evaluation.metrics,
            descriptors=evaluation.descriptors,
            artifacts={**evaluation.artifacts, "error": told, "audit": reason},
            stage=evaluation.stage,
            wall_s=evaluation.wall_s,
            seeds=evaluation.seeds,
            hardware=evaluation.hardware,
        )
        return kept_out, replace(verdict, decision=decision, reason=reason)

    async def _strict(self, candidate: Candidate, k: int) -> Evaluation:
        """The strict evaluation with extra seed ``k``, run again while the wall clock, not the
        program's budget, stopped it (``INFRASTRUCTURE_RETRIES`` times at most)."""
        for attempt in range(INFRASTRUCTURE_RETRIES + 1):
            result = await self.reevaluate(candidate, k)
            if not infrastructure_timeout(result):
                return result
            log.warning(
                "auditor: the strict re-evaluation of %s hit the wall limit before its budget "
                "(try %d of %d); running it again",
                candidate.id[:8],
                attempt + 1,
                INFRASTRUCTURE_RETRIES + 1,
            )
        return result
