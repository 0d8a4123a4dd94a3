import pickle

import pytest

from evolve.types import (
    Descriptor,
    Direction,
    EvalStatus,
    Evaluation,
    Objective,
    Proposal,
    content_hash,
)


def test_descriptor_bins_clamp_out_of_range_values_to_the_edges():
    axis = Descriptor(name="x", low=0.0, high=1.0, bins=4)
    assert [axis.bin(v) for v in (-5.0, 0.0, 0.24, 0.25, 0.99, 1.0, 7.0)] == [0, 0, 0, 1, 3, 3, 3]
    assert axis.bin(float("nan")) == 0


def test_descriptor_rejects_an_empty_range():
    with pytest.raises(ValueError, match="must exceed"):
        Descriptor(name="x", low=1.0, high=1.0, bins=3)


def test_objective_orients_minimisation():
    objective = Objective(name="loss", direction=Direction.MINIMIZE)
    assert objective.better(1.0, 2.0) and not objective.better(2.0, 1.0) and objective.better(5.0, None)


def test_ok_evaluation_needs_a_finite_fitness():
    with pytest.raises(ValueError):
        Evaluation(status=EvalStatus.OK, fitness=float("nan"))


def test_records_are_frozen_and_pickle_round_trip():
    evaluation = Evaluation(status=EvalStatus.OK, fitness=1.5, metrics={"a": 1}, descriptors={"d": 0.5})
    assert pickle.loads(pickle.dumps(evaluation)) == evaluation
    with pytest.raises(TypeError):
        evaluation.metrics["b"] = 2  # read-only view


def test_content_hash_ignores_dict_order_but_not_content():
    assert content_hash({"a": "1", "b": "2"}) == content_hash({"b": "2", "a": "1"})
    assert content_hash({"a": "1"}) != content_hash({"a": "2"})
    assert Proposal(files={"a": "1"}, operator="x").id == content_hash({"a": "1"})
