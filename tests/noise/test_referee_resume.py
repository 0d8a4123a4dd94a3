"""The seed's calibration, interrupted and resumed: stored samples are never measured again."""

import asyncio

import pytest

from evolve.archive.grid import Archive
from evolve.archive.noise import REEVALUATION, reevaluation_seed
from evolve.archive.referee import Referee
from evolve.settings import NoiseSettings
from evolve.store.database import Store
from evolve.types import EvalStatus, Evaluation, Objective, Proposal


class Killed(BaseException):
    """Stands for the process being stopped in the middle of the calibration."""


@pytest.mark.parametrize(
    "seeds_of",
    [
        lambda s: (s,),  # one seed per evaluation
        lambda s: (s, s + 1, s + 2),  # a fitness running several seeds (speedrun n_seeds=3)
        lambda s: (),  # a verdict made by the backend (timeout, lost worker) names no seed
    ],
    ids=["one-seed", "three-seeds", "no-seeds"],
)
def test_a_resumed_calibration_measures_only_the_missing_samples(tmp_path, seeds_of):
    store = Store(tmp_path / "archive.db")
    seed = store.add_candidate(Proposal(files={"p.py": "x = 1"}, operator="seed"), seq=0)
    archive = Archive(store=store, objective=Objective(name="f"))
    measured: list[int] = []
    budget = [2]  # samples measured before the "kill"

    async def reevaluate(slot, candidate, k):
        if budget[0] is not None and len(measured) >= budget[0]:
            raise Killed
        measured.append(k)
        return Evaluation(status=EvalStatus.OK, fitness=1.0 + k / 10, seeds=seeds_of(reevaluation_seed(7, k)))

    referee = Referee(
        store=store,
        archive=archive,
        settings=NoiseSettings(seeds=5),
        reevaluate=reevaluate,
        sample_seed=lambda candidate, k: reevaluation_seed(7, k),
    )
    first = Evaluation(status=EvalStatus.OK, fitness=1.0, seeds=(7,))
    with pytest.raises(Killed):
        asyncio.run(referee.calibrate(seed, first))
    assert measured == [1, 2]
    budget[0] = None
    verdict = asyncio.run(referee.calibrate(seed, first))
    assert measured == [1, 2, 3, 4]
    assert len(store.evaluations_at(seed.id, REEVALUATION)) == 4
    assert verdict.metrics["fitness_n"] == 5
    assert verdict.fitness == pytest.approx(sum(1.0 + k / 10 for k in range(5)) / 5)
