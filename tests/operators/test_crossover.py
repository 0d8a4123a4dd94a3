"""LLM ``crossover``: two parents shown, a child edited from parent A, two crossover edges."""

from __future__ import annotations

import asyncio
import random

import pytest

from evolve.llm import LLMClient, LLMSettings
from evolve.operators.base import OperatorRejected, OperatorRequest
from evolve.operators.crossover import Crossover
from evolve.store.database import Store
from evolve.types import EdgeRole
from tests.fixtures import scripted_provider
from tests.operators.test_mutate import FILES, HARNESS, PROGRAM, benchmark, parent

OTHER = {
    "main.py": PROGRAM.replace("[0.05] * n", "[0.04] * (n - 1) + [0.2]"),
    "harness.py": HARNESS,
}
CHILD = """Take B's one big circle and keep A's uniform small ones.

main.py
<<<<<<< SEARCH
    return [0.05] * n
=======
    return [0.05] * (n - 1) + [0.2]
>>>>>>> REPLACE
"""


@pytest.fixture
def scripted():
    return scripted_provider.install()


@pytest.fixture
def operator(tmp_path) -> Crossover:
    client = LLMClient(
        LLMSettings.from_config({"model": "scripted/m", "retries": 0}),
        store=Store(tmp_path / "a.db"),
    )
    return Crossover(client=client, model="scripted/m")


def test_crossover_shows_both_parents_and_links_both(scripted, operator, tmp_path) -> None:
    scripted.queue("m", CHILD)
    a, b = parent(FILES, 1.3, cid="a" * 20), parent(OTHER, 1.5, cid="b" * 20)
    req = OperatorRequest(
        parents=[a, b], benchmark=benchmark(tmp_path), rng=random.Random(1), seq=3
    )
    proposal = asyncio.run(operator.propose(req))
    assert proposal.parents == (("a" * 20, EdgeRole.CROSSOVER), ("b" * 20, EdgeRole.CROSSOVER))
    assert (
        "[0.05] * (n - 1) + [0.2]" in proposal.files["main.py"] and proposal.operator == "crossover"
    )
    user = scripted.requests[0][1][1]["content"]
    assert "Parent A `aaaaaaaaaaaa`" in user and "Parent B `bbbbbbbbbbbb`" in user
    assert "[0.04] * (n - 1) + [0.2]" in user and "sum_radii: 1.5" in user


def test_the_same_parent_twice_is_refused_not_paired_with_an_inspiration(
    scripted, operator, tmp_path
) -> None:
    """An inspiration (the island's best) may be the parent's own ancestor: the emitter draws
    crossover parents apart, and repeats the first only when the archive holds no such pair."""
    a, other = parent(FILES, cid="a" * 20), parent(OTHER, cid="c" * 20)
    req = OperatorRequest(
        parents=[a, a], inspirations=[other], benchmark=benchmark(tmp_path), rng=random.Random(1)
    )
    with pytest.raises(OperatorRejected, match="neither descending from the other"):
        asyncio.run(operator.propose(req))
    assert scripted.requests == []


def test_one_elite_only_is_rejected_without_a_call(scripted, operator, tmp_path) -> None:
    a = parent(FILES, cid="a" * 20)
    req = OperatorRequest(parents=[a, a], benchmark=benchmark(tmp_path), rng=random.Random(1))
    with pytest.raises(OperatorRejected, match="two different parents") as caught:
        asyncio.run(operator.propose(req))
    assert caught.value.model == "scripted/m" and scripted.requests == []
