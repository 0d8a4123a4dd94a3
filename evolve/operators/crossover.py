"""LLM ``crossover``: a model combines two parents (from different cells where possible) into one child."""

from __future__ import annotations

from collections.abc import Sequence

from evolve.operators.base import OperatorRejected, OperatorRequest
from evolve.operators.mutate import LLMOperator
from evolve.operators.prompting import context_values, program_view
from evolve.types import EdgeRole, Parent


class Crossover(LLMOperator):
    """Shows two parents and asks for SEARCH/REPLACE blocks that turn parent A into their child.

    The emitter samples the two parents from distinct cells when the island has them. If
    both are the same candidate, an inspiration (another elite) takes the second place;
    with no other elite at all the request is rejected.
    """

    name = "crossover"
    arity = 2
    template = "crossover.md.j2"

    def parents(self, request: OperatorRequest) -> Sequence[Parent]:
        first = request.parents[0]
        others = [*request.parents[1:], *request.inspirations]
        second = next((p for p in others if p.candidate.id != first.candidate.id), None)
        if second is None:
            raise OperatorRejected(
                "crossover needs two different parents; the archive holds one elite so far",
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
