"""LLM ``crossover``: a model combines two parents (from different cells where possible) into one child."""

from __future__ import annotations

from collections.abc import Sequence

from evolve.operators.base import OperatorRejected, OperatorRequest
from evolve.operators.mutate import LLMOperator
from evolve.operators.prompting import context_values, program_view
from evolve.types import EdgeRole, Parent


class Crossover(LLMOperator):
    """Shows two parents and asks for SEARCH/REPLACE blocks that turn parent A into their child.

    The emitter samples the two parents from distinct cells, neither descending from the
    other (``Archive.sample_cells(apart=True)``); when the archive holds no such pair it
    repeats the first, and the request is rejected.
    """

    name = "crossover"
    arity = 2
    template = "crossover.md.j2"

    def parents(self, request: OperatorRequest) -> Sequence[Parent]:
        first = request.parents[0]
        # not the inspirations: the island's best may be the first parent's own ancestor
        second = next((p for p in request.parents[1:] if p.candidate.id != first.candidate.id), None)
        if second is None:
            raise OperatorRejected(
                "crossover needs two different parents, neither descending from the other; "
                "the archive holds no such pair yet",
                model=self.model,
            )
        return (first, second)

    def values(self, request: OperatorRequest, parents: Sequence[Parent]) -> dict:
        first, second = parents
        inspirations = [p for p in request.inspirations if p.candidate.id != second.candidate.id]
        values = context_values(
            request.benchmark, first, inspirations, request.failures, self.budget, request.notes
        )
        values["first"] = program_view(first, request.benchmark, self.budget, label="Parent A")
        values["second"] = program_view(second, request.benchmark, self.budget, label="Parent B")
        return values

    def edges(self, parents: Sequence[Parent]) -> tuple[tuple[str, EdgeRole], ...]:
        return tuple((p.candidate.id, EdgeRole.CROSSOVER) for p in parents)
