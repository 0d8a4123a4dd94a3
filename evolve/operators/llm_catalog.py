"""The LLM operators of a run: one ``diff``, ``rewrite`` and ``crossover`` per configured model."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from evolve.llm import LLMClient, LLMSettings, preflight
from evolve.operators.base import Operator
from evolve.operators.crossover import Crossover
from evolve.operators.mutate import Diff, LLMOperator, Rewrite
from evolve.store.database import Store

log = logging.getLogger("evolve")

OPERATORS: dict[str, type[LLMOperator]] = {"diff": Diff, "rewrite": Rewrite, "crossover": Crossover}


def llm_operators(settings: LLMSettings, *, store: Store) -> list[tuple[Operator, float]]:
    """(operator, weight) for every model x LLM operator; the weight is model weight x operator weight.

    All operators share one client, hence one budget, one response cache and one record.
    """
    client = LLMClient(settings, store=store)
    made: list[tuple[Operator, float]] = []
    for model, model_weight in settings.models:
        for name, operator_weight in settings.operators.items():
            if operator_weight > 0:
                made.append(
                    (OPERATORS[name](client=client, model=model), model_weight * operator_weight)
                )
    return made


def llm_client(operators: Sequence[tuple[Operator, float]]) -> LLMClient | None:
    """The client shared by a run's LLM operators, or None when there are none."""
    for operator, _ in operators:
        if isinstance(operator, LLMOperator):
            return operator.client
    return None


async def preflight_operators(operators: Sequence[tuple[Operator, float]]) -> list[str]:
    """Check every model the run's LLM operators use, before anything is evaluated; returns warnings.

    Raises:
        PreflightError: a model cannot be used; the message names the fix.
    """
    client = llm_client(operators)
    return await preflight(client.settings) if client is not None else []
