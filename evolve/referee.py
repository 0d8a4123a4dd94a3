"""Noise-aware selection inside a run: calibrate the seed program's noise, re-evaluate close challengers.

The statistics live in ``evolve.noise``; this module is the part of the loop that asks for
more samples. The search gives it a way to evaluate a candidate once more with its k-th
extra seed, and hands it every finished evaluation: ``calibrate`` for the seed program
(``noise.seeds`` samples, side by side on the evaluation slots, each stored at once so a
killed run does not measure it again),
``settle`` for a challenger (more samples while its one-sided test against the cell's
incumbent is close, per ``noise.schedule``). The calibration becomes the archive's judge.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace

from evolve import noise as noise_aware
from evolve.archive import Archive
from evolve.fitness import Samples
from evolve.store import Store
from evolve.types import Candidate, Evaluation, EvolveError

log = logging.getLogger("evolve")

Reevaluate = Callable[[int, Candidate, int], Awaitable[Evaluation]]
"""(slot, candidate, k) -> the candidate's evaluation with its k-th extra seed."""


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
        elite = self.archive.incumbent(candidate.island, self.archive.cell_of(first))
        samples, p = [first], None
        while elite is None and len(samples) < self.settings.new_cell_seeds and samples[-1].ok:
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
        return verdict, samples[1:]

    def _use(self, calibration: noise_aware.Calibration) -> None:
        self.calibration = calibration
        self.archive.judge = noise_aware.NoiseJudge(
            store=self.store,
            objective=self.archive.objective,
            calibration=calibration,
            settings=self.settings,
        )
