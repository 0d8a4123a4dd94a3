"""The LLM operators of a run: one ``diff``, ``rewrite`` and ``crossover`` per configured model."""

from __future__ import annotations

from evolve.llm import LLMClient
from evolve.operators.base import Operator
from evolve.operators.crossover import Crossover
from evolve.operators.mutate import Diff, LLMOperator, Rewrite

OPERATORS: dict[str, type[LLMOperator]] = {"diff": Diff, "rewrite": Rewrite, "crossover": Crossover}


def llm_operators(client: LLMClient) -> list[tuple[Operator, float]]:
    """(operator, weight) for every model x LLM operator of ``client.settings``; the weight is
    model weight x operator weight.

    All operators share ``client``, hence one budget, one response cache and one record.
    """
    settings = client.settings
    made: list[tuple[Operator, float]] = []
    for model, model_weight in settings.models:
        for name, operator_weight in settings.operators.items():
            if operator_weight > 0:
                made.append(
                    (OPERATORS[name](client=client, model=model), model_weight * operator_weight)
                )
    return made
