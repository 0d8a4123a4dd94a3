"""Builds the run's operators from its configuration: the built-in ones, plus LLM ones when a model is set."""

from __future__ import annotations

from collections.abc import Mapping

from evolve.llm.settings import LLMSettings
from evolve.operators.base import Operator
from evolve.operators.builtin import BlockCrossover, Tweak
from evolve.settings import BuiltinWeights, ConfigError
from evolve.store.database import Store


def builtin_operators(weights: Mapping[str, float]) -> list[tuple[Operator, float]]:
    """The embedded default: ``tweak`` and block ``crossover`` with the given weights (0 drops one)."""
    made: list[tuple[Operator, float]] = []
    if weights.get("tweak", 0) > 0:
        made.append((Tweak(), float(weights["tweak"])))
    if weights.get("crossover", 0) > 0:
        made.append((BlockCrossover(), float(weights["crossover"])))
    return made


def build_operators(
    weights: BuiltinWeights, llm: LLMSettings, *, store: Store
) -> list[tuple[Operator, float]]:
    """All operators of a run with their weights.

    Args:
        weights: the ``operators.builtin`` weights.
        llm: the ``llm`` group; one diff/rewrite/crossover per model when it names any.
        store: where LLM calls are recorded and cached.

    Raises:
        ConfigError: no operator has a weight above 0 and no model is configured.
    """
    operators = builtin_operators(weights.as_dict())
    if llm.enabled:
        from evolve.operators.llm_catalog import llm_operators

        operators += llm_operators(llm, store=store)
    if not operators:
        raise ConfigError(
            "no operators: set operators.builtin weights above 0 or configure an LLM (llm=...)"
        )
    return operators
