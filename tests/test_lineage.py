"""Lineage graph: ancestry, path to the best, success per operator and model, exports."""

from __future__ import annotations

import json

import networkx as nx
import pytest

from evolve.query.edges import primary_path
from evolve.query.run import best_candidate, objective_direction
from evolve.research.lineage import Lineage
from evolve.research.plots import success_rates
from evolve.store.database import Store
from evolve.types import CandidateStatus, EdgeRole, EvalStatus, Evaluation, Proposal

M, X, INS = EdgeRole.MUTATION, EdgeRole.CROSSOVER, EdgeRole.INSPIRATION


def _add(
    store: Store,
    seq: int,
    name: str,
    parents,
    operator: str,
    model: str | None,
    fitness: float | None,
):
    proposal = Proposal(
        files={"main.py": f"# {name}\nX = {seq}\n"}, parents=parents, operator=operator, model=model
    )
    status = CandidateStatus.DONE if fitness is not None else CandidateStatus.FAILED
    store.add_candidate(proposal, seq=seq, status=status)
    if fitness is None:
        store.add_evaluation(
            proposal.id, Evaluation(status=EvalStatus.ERROR, artifacts={"error": "boom"})
        )
    else:
        store.add_evaluation(proposal.id, Evaluation(status=EvalStatus.OK, fitness=fitness))
    return proposal.id


@pytest.fixture(params=["max", "min"])
def tree(tmp_path, request):
    """seed S -> A (tweak) -> B (diff); C = crossover(A, S) inspired by B is the best; D (diff of C) failed."""
    sign = 1 if request.param == "max" else -1
    store = Store(tmp_path / "archive.db")
    store.set_state("objective", {"name": "score", "direction": request.param})
    s = _add(store, 0, "S", (), "seed", None, 1.0 * sign)
    a = _add(store, 1, "A", ((s, M),), "tweak", None, 1.2 * sign)
    b = _add(store, 2, "B", ((a, M),), "diff", "m1", 1.1 * sign)
    c = _add(store, 3, "C", ((a, X), (s, X), (b, INS)), "crossover", None, 1.5 * sign)
    d = _add(store, 4, "D", ((c, M),), "diff", "m2", None)
    store.put_elite(0, "0,0", c, 1.5 * sign)
    store.put_elite(0, "1,0", b, 1.1 * sign)
    store.put_elite(1, "0,0", a, 1.2 * sign)
    assert store.integrity_problems() == []
    yield store, dict(S=s, A=a, B=b, C=c, D=d), request.param
    store.close()


def test_best_path_and_direction(tree):
    store, ids, direction = tree
    assert objective_direction(store) == direction
    assert best_candidate(store) == ids["C"]
    assert primary_path(store, ids["C"]) == [ids["S"], ids["A"], ids["C"]]
    lineage = Lineage.load(store)
    assert lineage.best() == ids["C"]
    assert lineage.path_to_best() == [ids["S"], ids["A"], ids["C"]]
    assert lineage.parents(ids["C"]) == [ids["A"], ids["S"]]  # operator order, inspiration excluded


def test_ancestors_and_descendants(tree):
    store, ids, _ = tree
    lineage = Lineage.load(store)
    assert lineage.ancestors(ids["D"]) == {ids["S"], ids["A"], ids["C"]}
    assert lineage.descendants(ids["A"]) == {ids["B"], ids["C"], ids["D"]}
    with_inspirations = Lineage.load(
        store, roles=("mutation", "crossover", "migration", "inspiration")
    )
    assert ids["B"] in with_inspirations.ancestors(ids["C"])


def test_success_per_operator_and_model(tree):
    """Success per operator and model (plots.success_rates; Lineage.credit duplicated it)."""
    store, ids, _ = tree
    success = success_rates(store, last=None)
    per_operator = {row["operator"]: row for row in success["operator"]}
    assert per_operator["tweak"]["improved"] == 1
    assert per_operator["tweak"]["gain"] == pytest.approx(0.2)
    assert per_operator["crossover"]["improved"] == 1
    assert per_operator["crossover"]["gain"] == pytest.approx(0.3)
    diff = per_operator["diff"]
    assert (
        diff["candidates"],
        diff["evaluated"],
        diff["ok"],
        diff["improved"],
        diff["elites"],
    ) == (
        2,
        2,
        1,
        0,
        1,
    )
    models = {row["model"]: row for row in success["model"]}
    assert models["builtin"]["candidates"] == 3
    assert (models["m1"]["ok"], models["m2"]["ok"]) == (1, 0)


def test_around_matches_full_graph(tree):
    store, ids, _ = tree
    near = Lineage.around(store, ids["B"])
    assert {ids["S"], ids["A"], ids["B"], ids["C"]} <= set(
        near.graph.nodes
    )  # ancestors + path to best
    assert near.path_to_best() == [ids["S"], ids["A"], ids["C"]]
    assert near.graph.edges[ids["A"], ids["C"]]["role"] == "crossover"


def test_exports(tree, tmp_path):
    store, ids, _ = tree
    lineage = Lineage.load(store)
    data = lineage.to_json()
    json.dumps(data)
    assert data["best"] == ids["C"] and len(data["nodes"]) == 5 and len(data["edges"]) == 5
    dot = lineage.to_dot()
    assert (
        dot.startswith("digraph lineage {")
        and f'"{ids["A"]}" -> "{ids["C"]}"' in dot
        and "#d32f2f" in dot
    )
    path = lineage.write_graphml(tmp_path / "lineage.graphml")
    back = nx.read_graphml(path)
    assert set(back.nodes) == set(ids.values())
    assert back.nodes[ids["C"]]["operator"] == "crossover"


def test_direction_inferred_from_stats(tmp_path):
    store = Store(tmp_path / "archive.db")
    for best in (5.0, 4.0, 3.5):
        store.add_stats(evaluated=1, best=best, coverage=0.1, qd_score=1.0, cost=0.0, failures=0)
    assert objective_direction(store) == "min"
    store.close()
    empty = Store(tmp_path / "empty.db")
    assert objective_direction(empty) == "max" and best_candidate(empty) is None
