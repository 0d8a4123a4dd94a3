"""The emitter's bandit: its choices, rewards, discounting and state, and the asks it makes."""

from __future__ import annotations

import json
import random

import pytest

from evolve.archive.grid import Archive
from evolve.harness.fitness import Benchmark
from evolve.operators.builtin import BlockCrossover, Tweak
from evolve.search.emitters import Ask, BanditState, Emitter, arm_key, reward
from evolve.store.database import Store
from evolve.types import AddResult, AddStatus, EdgeRole, EvalStatus, Evaluation, Proposal
from tests.fixtures.toy import Toy

NEW = AddResult(status=AddStatus.NEW)
KEPT_OUT = AddResult(status=AddStatus.NOT_ADDED)


def improved(gain: float) -> AddResult:
    return AddResult(status=AddStatus.IMPROVE_EXISTING, improvement=gain)


@pytest.fixture
def parts(tmp_path) -> tuple[Archive, Benchmark]:
    seed_dir = tmp_path / "seed"
    seed_dir.mkdir()
    (seed_dir / "params.py").write_text(
        "# EVOLVE-BLOCK-START\nA = 1.0\nB = 4\n# EVOLVE-BLOCK-END\n"
    )
    fitness = Toy()
    store = Store(tmp_path / "archive.db")
    archive = Archive(store=store, objective=fitness.objective, descriptors=fitness.descriptors)
    return archive, Benchmark(name="toy", fitness=fitness, seed_dir=seed_dir)


def emitter(parts, selection: str = "bandit", discount: float = 0.9, **kw) -> Emitter:
    archive, _ = parts
    return Emitter(
        archive=archive,
        operators=[(Tweak(), 3.0), (BlockCrossover(), 1.0)],
        selection=selection,
        discount=discount,
        **kw,
    )


def test_the_arm_key_is_the_operator_and_its_model() -> None:
    assert arm_key("diff", "openai/gpt-4o") == "diff@openai/gpt-4o"
    assert arm_key("tweak", None) == "tweak"


def test_rewards_rank_new_cells_over_improvements_over_nothing() -> None:
    assert reward(None, 1.0) == 0.0 and reward(KEPT_OUT, 1.0) == 0.0
    assert reward(NEW, 1.0) == 1.0
    small, typical, large = (reward(improved(g), 1.0) for g in (0.01, 1.0, 5.0))
    assert 0.5 < small < typical < large < 1.0
    assert typical == pytest.approx(0.5 + 0.5 * 0.7615941559557649)
    assert reward(improved(5.0), 0.0) == 0.75  # no scale learned yet


def test_choices_are_a_function_of_the_seed(parts) -> None:
    for selection in ("bandit", "weights"):
        a, b = emitter(parts, selection), emitter(parts, selection)
        first = [a.choose(random.Random(f"7:{i}")) for i in range(50)]
        assert first == [b.choose(random.Random(f"7:{i}")) for i in range(50)]
        assert set(first) == {"tweak", "crossover"}
    weights = emitter(parts, "weights")
    rng = random.Random(0)
    picks = [weights.choose(rng) for _ in range(4000)]
    assert 0.70 < picks.count("tweak") / len(picks) < 0.80  # weights 3:1


def test_the_bandit_tries_every_arm_then_prefers_the_one_that_pays(parts) -> None:
    bandit = emitter(parts, exploration=0.1)
    assert bandit.choose(random.Random(0)) in ("tweak", "crossover")
    bandit.tell("crossover", None)
    assert {bandit.choose(random.Random(i)) for i in range(20)} == {"tweak"}  # untried first
    for _ in range(10):
        bandit.tell("tweak", None)
        bandit.tell("crossover", NEW)
    assert {bandit.choose(random.Random(i)) for i in range(20)} == {"crossover"}


def test_every_update_discounts_all_arms_and_tracks_the_improvement_scale(parts) -> None:
    bandit = emitter(parts, discount=0.5)
    bandit.tell("tweak", NEW)
    bandit.tell("crossover", improved(2.0))
    bandit.tell("tweak", improved(4.0))
    state = bandit.state
    assert state.counts == {"tweak": 0.5 * 0.5 + 1.0, "crossover": 0.5}
    assert state.improvements_seen == 2 and state.improvement_scale == pytest.approx(3.0)
    crossover_reward = reward(improved(2.0), 2.0)  # the scale was 2.0 when it was told
    tweak_reward = reward(improved(4.0), 3.0)
    assert state.rewards["crossover"] == pytest.approx(0.5 * crossover_reward)
    assert state.rewards["tweak"] == pytest.approx(0.25 * 1.0 + tweak_reward)
    bandit.tell("an arm of an earlier configuration", NEW)  # ignored
    assert set(state.counts) == {"tweak", "crossover"}


def test_the_state_survives_a_round_trip_through_json(parts) -> None:
    bandit = emitter(parts)
    rng = random.Random(3)
    for i in range(30):
        bandit.tell(bandit.choose(rng), [None, NEW, improved(0.3), KEPT_OUT][i % 4])
    restored = emitter(parts)
    restored.state = BanditState.from_json(json.loads(json.dumps(bandit.state.to_json())))
    assert restored.state == bandit.state
    assert [restored.choose(random.Random(i)) for i in range(40)] == [
        bandit.choose(random.Random(i)) for i in range(40)
    ]
    assert BanditState.from_json(None) == BanditState()


def test_bad_settings_name_the_fix(parts) -> None:
    with pytest.raises(
        ValueError, match="emitter.selection 'ucb' unknown; choose one of bandit, weights"
    ):
        emitter(parts, "ucb")
    archive, _ = parts
    with pytest.raises(ValueError, match="weights must be positive"):
        Emitter(archive=archive, operators=[(Tweak(), 0.0)])


def test_an_ask_fixes_what_the_operator_sees_and_survives_json(parts) -> None:
    archive, _ = parts
    bandit = emitter(parts)
    seed = Proposal(
        files={"params.py": "# EVOLVE-BLOCK-START\nA = 1.0\nB = 4\n# EVOLVE-BLOCK-END\n"},
        operator="seed",
    )
    store = archive.store
    with store.transaction():
        store.add_candidate(seed, seq=0)
        store.add_evaluation(
            seed.id,
            Evaluation(status=EvalStatus.OK, fitness=-1.0, descriptors={"a": 1.0, "b": 4.0}),
        )
        archive.add(seed.id, store.evaluation(seed.id), island=0)
    ask = bandit.ask(seq=5, rng=random.Random(1), island=0, migrant=seed.id)
    assert ask.seq == 5 and ask.parents[0] == (seed.id, None) and ask.migrant == seed.id
    assert Ask.from_json(json.loads(json.dumps(ask.to_json()))) == ask
    assert ask.edges(EdgeRole.MUTATION)[0] == (seed.id, EdgeRole.MIGRATION)
    again = bandit.ask(seq=5, rng=random.Random(1), island=0, migrant=seed.id)
    assert again == ask  # a function of the archive and the random stream
    rng = random.Random(2)
    request = ask.request(archive, benchmark=parts[1], rng=rng, notes="the notebook")
    assert [p.candidate.id for p in request.parents] == [pid for pid, _ in ask.parents]
    assert request.parents[0].evaluation.fitness == -1.0 and request.rng is rng
    assert (request.seq, request.island, request.notes) == (5, 0, "the notebook")


def test_an_asks_child_lives_on_its_island_with_the_migrants_edge() -> None:
    ask = Ask(seq=3, island=2, arm="crossover", parents=(("m", None), ("p", None)), migrant="m")
    roles = (("m", EdgeRole.CROSSOVER), ("p", EdgeRole.CROSSOVER), ("i", EdgeRole.INSPIRATION))
    proposal = Proposal(files={"params.py": "A = 2\n"}, operator="crossover", parents=roles)
    child = ask.child(proposal)
    assert child.island == 2 and child.files == proposal.files
    assert child.parents == (
        ("m", EdgeRole.MIGRATION),
        ("p", EdgeRole.CROSSOVER),
        ("i", EdgeRole.INSPIRATION),
    )
    assert ask.edges(EdgeRole.CROSSOVER) == child.parents[:2]  # a rejection's edges alike
    unmigrated = Ask(seq=4, island=0, arm="crossover", parents=(("m", None), ("p", None)))
    assert unmigrated.child(proposal).parents == roles
