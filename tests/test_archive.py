import random

import pytest

from evolve.archive.grid import Archive
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


def make(tmp_path, **kwargs):
    store = Store(tmp_path / "archive.db")
    archive = Archive(
        store=store,
        objective=Objective(name="f", direction=kwargs.pop("direction", Direction.MAXIMIZE)),
        descriptors=(Descriptor(name="d", low=0.0, high=1.0, bins=4),),
        **kwargs,
    )
    return store, archive


def add(store, archive, seq, fitness, d, island=0, status=EvalStatus.OK):
    proposal = Proposal(files={"f": f"{seq}"}, operator="t")
    store.add_candidate(proposal, seq=seq)
    evaluation = Evaluation(status=status, fitness=fitness if status == EvalStatus.OK else None, descriptors={"d": d})
    with store.transaction():
        store.set_status(proposal.id, CandidateStatus.DONE if evaluation.ok else CandidateStatus.FAILED)
        store.add_evaluation(proposal.id, evaluation)
        return archive.add(proposal.id, evaluation, island=island)


def test_add_reports_new_improvement_and_not_added(tmp_path):
    store, archive = make(tmp_path)
    assert add(store, archive, 0, 1.0, 0.1).status == AddStatus.NEW
    better = add(store, archive, 1, 1.5, 0.2)
    assert better.status == AddStatus.IMPROVE_EXISTING and better.improvement == pytest.approx(0.5)
    assert add(store, archive, 2, 1.2, 0.15).status == AddStatus.NOT_ADDED
    assert add(store, archive, 3, None, 0.9, status=EvalStatus.ERROR).status == AddStatus.NOT_ADDED
    assert add(store, archive, 4, 0.1, 5.0).cell == "3"  # out of range -> edge bin
    assert archive.best()[1] == 1.5


def test_minimisation_prefers_smaller_values(tmp_path):
    store, archive = make(tmp_path, direction=Direction.MINIMIZE)
    add(store, archive, 0, 1.0, 0.1)
    assert add(store, archive, 1, 0.5, 0.1).status == AddStatus.IMPROVE_EXISTING
    assert add(store, archive, 2, 0.7, 0.1).status == AddStatus.NOT_ADDED


def test_islands_keep_separate_grids_and_stats(tmp_path):
    store, archive = make(tmp_path, islands=2, qd_offset=0.0)
    add(store, archive, 0, 1.0, 0.1, island=0)
    assert add(store, archive, 1, 0.5, 0.1, island=1).status == AddStatus.NEW
    stats = archive.stats()
    assert stats["coverage"] == pytest.approx(2 / 8) and stats["qd_score"] == pytest.approx(1.5)
    assert archive.migrant_for(1) == archive.elites(0)[0][2].candidate_id


def test_qd_score_counts_gains_over_the_seed_and_never_falls_when_minimising(tmp_path):
    store, archive = make(tmp_path, direction=Direction.MINIMIZE)
    scores = []
    for seq, (fitness, d) in enumerate([(2.0, 0.1), (2.5, 0.4), (1.5, 0.6), (1.8, 0.1), (3.0, 0.9)]):
        add(store, archive, seq, fitness, d)
        scores.append(archive.stats()["qd_score"])
    # seed 2.0; a worse new cell (2.5) adds nothing; 1.5 adds 0.5; 1.8 replaces the seed's cell: +0.2
    assert scores == pytest.approx([0.0, 0.0, 0.5, 0.7, 0.7])
    assert archive.stats()["coverage"] == pytest.approx(4 / 4)


def test_elites_survive_reopening(tmp_path):
    store, archive = make(tmp_path)
    add(store, archive, 0, 1.0, 0.1)
    add(store, archive, 1, 2.0, 0.6)
    store.close()
    _, reopened = make(tmp_path)
    assert reopened.best()[1] == 2.0 and len(reopened.elites()) == 2


def test_rank_sampling_prefers_better_elites_and_uses_distinct_cells(tmp_path):
    store, archive = make(tmp_path)
    for seq, (fitness, d) in enumerate([(4.0, 0.1), (3.0, 0.3), (2.0, 0.6), (1.0, 0.9)]):
        add(store, archive, seq, fitness, d)
    rng = random.Random(0)
    firsts = [archive.sample_parents(1, rng, island=0)[0].evaluation.fitness for _ in range(400)]
    assert firsts.count(4.0) > firsts.count(1.0) * 2
    pair = archive.sample_parents(2, rng, island=0)
    assert pair[0].cell != pair[1].cell
    inspirations = archive.inspirations(3, rng, island=0, exclude=[pair[0].candidate.id])
    assert pair[0].candidate.id not in {p.candidate.id for p in inspirations}


def test_unknown_sampler_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="uniform"):
        make(tmp_path, sampler="best")


def test_an_island_with_one_elite_borrows_the_second_parent_from_another_island(tmp_path):
    store, archive = make(tmp_path, islands=3)
    add(store, archive, 0, 1.0, 0.1, island=0)
    assert archive.sample_cells(2, random.Random(0), island=0) == [(archive.elites(0)[0][2].candidate_id, "0")] * 2
    add(store, archive, 1, 2.0, 0.1, island=1)
    add(store, archive, 2, 3.0, 0.9, island=2)
    for seed in range(20):
        pairs = archive.sample_cells(2, random.Random(seed), island=0)
        assert pairs[0][0] == archive.elites(0)[0][2].candidate_id  # the island's own elite first
        assert pairs[1][0] != pairs[0][0]
    assert len({archive.sample_cells(2, random.Random(s), island=0)[1][0] for s in range(20)}) == 2


def test_a_crowded_cell_splits_its_elite_keeps_the_address_and_reopening_finds_the_same_cells(tmp_path):
    store, archive = make(tmp_path, split_depth=1)
    assert add(store, archive, 0, 1.0, 0.1).cell == "0"
    assert archive.rival(Evaluation(status=EvalStatus.OK, fitness=0.0, descriptors={"d": 0.2}), 0) is None
    second = add(store, archive, 1, 0.5, 0.2)  # worse, but the crowded cell splits: a sub-cell of its own
    assert (second.status, second.cell) == (AddStatus.NEW, "0/1")
    assert archive.incumbent(0, "0").value == 1.0  # the first elite keeps its address
    assert add(store, archive, 2, 0.4, 0.15).status == AddStatus.NOT_ADDED  # "0/1" is as deep as cells go
    assert add(store, archive, 3, 0.3, 0.05).cell == "0/0"
    assert archive.stats()["coverage"] == pytest.approx(1 / 4)  # one base cell of four holds elites
    store.close()
    store, reopened = make(tmp_path, split_depth=1)
    assert sorted(cell for _, cell, _ in reopened.elites()) == ["0", "0/0", "0/1"]
    better = add(store, reopened, 4, 0.9, 0.01)
    assert (better.status, better.cell) == (AddStatus.IMPROVE_EXISTING, "0/0")
    assert reopened.rival(Evaluation(status=EvalStatus.OK, fitness=0.0, descriptors={"d": 0.01}), 0).value == 0.9


def test_a_fixed_grid_never_splits(tmp_path):
    store, archive = make(tmp_path)
    add(store, archive, 0, 1.0, 0.1)
    assert add(store, archive, 1, 0.5, 0.2).status == AddStatus.NOT_ADDED
    with pytest.raises(ValueError, match="split_depth"):
        make(tmp_path, split_depth=-1)


def add_child(store, archive, seq, fitness, d, parents, island=0):
    """A candidate made from ``parents`` (mutation edges), scored and offered to the archive."""
    from evolve.types import EdgeRole

    proposal = Proposal(
        files={"f": f"{seq}"}, operator="t", parents=tuple((p, EdgeRole.MUTATION) for p in parents)
    )
    store.add_candidate(proposal, seq=seq)
    evaluation = Evaluation(status=EvalStatus.OK, fitness=fitness, descriptors={"d": d})
    with store.transaction():
        store.set_status(proposal.id, CandidateStatus.DONE)
        store.add_evaluation(proposal.id, evaluation)
        archive.add(proposal.id, evaluation, island=island)
    return proposal.id


def test_a_parent_whose_children_are_not_kept_is_drawn_less_often(tmp_path):
    """Cully & Demiris 2018's curiosity score: +1 per child kept, -0.5 per child not kept."""
    store, archive = make(tmp_path)
    for seq, (fitness, d) in enumerate([(4.0, 0.1), (3.0, 0.3), (2.0, 0.6), (1.0, 0.9)]):
        add(store, archive, seq, fitness, d)
    best = archive.best()[0]

    def share(curiosity) -> float:
        rng = random.Random(0)
        draws = [archive.sample_cells(1, rng, island=0, curiosity=curiosity)[0][0] for _ in range(400)]
        return draws.count(best) / len(draws)

    plateau = {best: 24 * -0.5}  # edited 24 times, nothing kept
    assert share(None) > 0.4 and share(plateau) < 0.1
    assert share({best: 3.0}) == share(None)  # productivity adds nothing to rank


def test_crossover_parents_are_drawn_apart_from_each_others_lineage(tmp_path):
    store, archive = make(tmp_path, islands=1)
    seed_id = add_child(store, archive, 0, 1.0, 0.1, [])
    child = add_child(store, archive, 1, 2.0, 0.3, [seed_id])
    grandchild = add_child(store, archive, 2, 3.0, 0.6, [child])
    assert archive.kin(child) == {seed_id, child, grandchild}
    # every elite descends from every other: no pair apart, the first is repeated (refused)
    for s in range(20):
        first, second = archive.sample_cells(2, random.Random(s), island=0, apart=True)
        assert first == second
    cousin = add_child(store, archive, 3, 0.5, 0.9, [seed_id])
    pairs = {
        frozenset(p[0] for p in archive.sample_cells(2, random.Random(s), island=0, apart=True))
        for s in range(40)
    }
    assert pairs == {frozenset({cousin, child}), frozenset({cousin, grandchild})}
    assert archive.sample_cells(2, random.Random(0), island=0, apart=True, first=grandchild)[1] == (
        cousin,
        "3",
    )
