"""evolve.archive.noise: settings, the re-evaluation schedule, verdict rows and the archive's judge."""

import pytest

from evolve.archive.grid import Archive
from evolve.archive.noise import (
    Calibration,
    NoiseJudge,
    make_calibration,
    next_count,
    pvalue,
    reevaluation_seed,
    summarize,
)
from evolve.archive.statistics import Samples
from evolve.settings import NoiseSettings
from evolve.store.database import Store
from evolve.types import (
    AddStatus,
    CandidateStatus,
    Descriptor,
    Direction,
    EvalStatus,
    Evaluation,
    Objective,
    Proposal,
)

SETTINGS = NoiseSettings(seeds=5, alpha=0.01, close=0.2, schedule=(1, 4))


def ok(fitness, seed=0, **metrics):
    return Evaluation(
        status=EvalStatus.OK,
        fitness=fitness,
        metrics={"score": fitness, **metrics},
        descriptors={"d": 0.5},
        seeds=(seed,),
        wall_s=1.0,
    )


def calibration(values, seed_id="seed"):
    return make_calibration(seed_id, [ok(v, seed=i) for i, v in enumerate(values)])


def test_settings_validate_and_name_the_fix():
    assert not NoiseSettings().enabled and NoiseSettings(seeds=2).enabled
    assert SETTINGS.look_alpha(1) == pytest.approx(0.002)
    assert SETTINGS.look_alpha(4) == pytest.approx(0.008) and SETTINGS.look_alpha(
        9
    ) == pytest.approx(0.008)
    assert NoiseSettings.from_config({"seeds": 3, "schedule": [1, 2, 6]}).schedule == (1, 2, 6)
    assert NoiseSettings.from_config(None) == NoiseSettings()
    for bad, match in [
        ({"seeds": 0}, "seeds"),
        ({"alpha": 1.5}, "alpha"),
        ({"close": 0.001}, "close"),
        ({"schedule": [2, 4]}, "start at 1"),
        ({"schedule": [1, 3, 3]}, "increase"),
        ({"level": 1}, "level"),
        ({"sigma": 1}, "valid keys"),
    ]:
        with pytest.raises(ValueError, match=match):
            NoiseSettings.from_config(bad)


def test_reevaluation_seeds_are_stable_and_distinct():
    seeds = [reevaluation_seed(12345, k) for k in range(1, 50)]
    assert seeds == [reevaluation_seed(12345, k) for k in range(1, 50)]
    assert len(set(seeds)) == 49 and all(0 <= s < 2**31 for s in seeds)


def test_next_count_follows_the_schedule():
    assert next_count(1, 0.001, SETTINGS) is None  # significant: decided
    assert next_count(1, 0.5, SETTINGS) is None  # far: decided
    assert next_count(1, 0.1, SETTINGS) == 4  # close: more seeds
    assert next_count(4, 0.1, SETTINGS) is None  # schedule exhausted
    three = NoiseSettings(seeds=5, schedule=(1, 3, 8))
    assert next_count(3, 0.05, three) == 8


def test_calibration_round_trips_through_json():
    cal = calibration([1.0, 1.5, 0.5, 1.2, 0.8])
    back = Calibration.from_json(cal.to_json())
    assert back.fitness.n == 5 and back.sigma() == pytest.approx(cal.sigma())
    assert back.metrics["score"].mean == pytest.approx(1.0) and back.seeds == (0, 1, 2, 3, 4)


def test_summarize_stores_the_mean_interval_and_every_seed():
    cal = calibration([0.0, 1.0, -1.0, 0.5, -0.5])
    verdict = summarize(
        [ok(1.0, 11), ok(2.0, 12), ok(3.0, 13)], calibration=cal, settings=SETTINGS, p=0.003
    )
    m = verdict.metrics
    assert (
        verdict.fitness == pytest.approx(2.0)
        and verdict.seeds == (11, 12, 13)
        and verdict.wall_s == 3.0
    )
    assert m["fitness_n"] == 3 and m["fitness_pvalue"] == 0.003 and m["score"] == 1.0
    assert m["fitness_ci_low"] < 2.0 < m["fitness_ci_high"]
    single = summarize([ok(1.0, 11)], calibration=cal, settings=SETTINGS)
    assert single.metrics["fitness_ci_low"] < 1.0 < single.metrics["fitness_ci_high"]
    assert "fitness_pvalue" not in single.metrics


def test_a_failure_on_another_seed_fails_the_candidate():
    cal = calibration([0.0, 1.0, -1.0])
    crash = Evaluation(status=EvalStatus.ERROR, artifacts={"error": "boom"}, seeds=(12,))
    verdict = summarize([ok(1.0, 11), crash], calibration=cal, settings=SETTINGS)
    assert verdict.status == EvalStatus.ERROR and verdict.fitness is None
    assert "re-evaluation 1 with seed (12,) failed" in verdict.artifacts["error"]
    assert "boom" in verdict.artifacts["error"] and verdict.seeds == (11, 12)


def test_pvalue_counts_the_seed_samples_once():
    cal = calibration([0.0, 1.0, -1.0, 0.5, -0.5])
    challenger = Samples(n=1, mean=3.0)
    as_seed = pvalue(
        challenger,
        cal.fitness,
        calibration=cal,
        incumbent_is_seed=True,
        objective=Objective(name="f"),
    )
    as_other = pvalue(
        challenger,
        cal.fitness,
        calibration=cal,
        incumbent_is_seed=False,
        objective=Objective(name="f"),
    )
    assert as_other < as_seed  # the same samples counted twice would claim more certainty


def add(store, archive, seq, evaluation):
    proposal = Proposal(files={"f": str(seq)}, operator="seed" if seq == 0 else "t")
    store.add_candidate(proposal, seq=seq)
    with store.transaction():
        store.set_status(proposal.id, CandidateStatus.DONE)
        store.add_evaluation(proposal.id, evaluation)
        return proposal.id, archive.add(proposal.id, evaluation, island=0)


@pytest.mark.parametrize("direction", [Direction.MAXIMIZE, Direction.MINIMIZE])
def test_the_judge_refuses_gains_within_noise_and_accepts_gains_beyond(tmp_path, direction):
    store = Store(tmp_path / "archive.db")
    objective = Objective(name="f", direction=direction)
    archive = Archive(
        store=store, objective=objective, descriptors=(Descriptor(name="d", low=0, high=1, bins=2),)
    )
    sign = 1 if direction == Direction.MAXIMIZE else -1
    values = [0.0, 1.0, -1.0, 0.5, -0.5, 0.2, -0.2, 0.0]  # sd ~0.63
    cal = calibration(values)
    seed_verdict = summarize(
        [ok(v, i) for i, v in enumerate(values)],
        calibration=cal,
        settings=SETTINGS,
        own_calibration=True,
    )
    seed_id, result = add(store, archive, 0, seed_verdict)
    cal = make_calibration(seed_id, [ok(v, i) for i, v in enumerate(values)])
    assert result.status == AddStatus.NEW
    archive.judge = NoiseJudge(store=store, objective=objective, calibration=cal, settings=SETTINGS)
    small = summarize([ok(sign * 0.5, 100)], calibration=cal, settings=SETTINGS)
    assert add(store, archive, 1, small)[1].status == AddStatus.NOT_ADDED
    large = summarize([ok(sign * 5.0, 101)], calibration=cal, settings=SETTINGS)
    cid, result = add(store, archive, 2, large)
    assert result.status == AddStatus.IMPROVE_EXISTING and result.improvement == pytest.approx(
        5.0 - 0.0
    )
    # against a non-seed incumbent with one sample, a modest gain is not enough either
    modest = summarize([ok(sign * 5.6, 102)], calibration=cal, settings=SETTINGS)
    assert add(store, archive, 3, modest)[1].status == AddStatus.NOT_ADDED
    archive.judge = None  # plain comparison: the same modest gain replaces the elite
    assert (
        add(
            store, archive, 4, summarize([ok(sign * 5.6, 103)], calibration=cal, settings=SETTINGS)
        )[1].status
        == AddStatus.IMPROVE_EXISTING
    )
