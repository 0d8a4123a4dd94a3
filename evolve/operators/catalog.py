"""Builds the run's operators from its configuration: the built-in ones, plus LLM ones when a model is set."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from evolve.operators.base import Operator
from evolve.operators.builtin import BlockCrossover, Tweak
from evolve.settings import BuiltinWeights, ConfigError

if TYPE_CHECKING:
    from evolve.llm import LLMClient


def builtin_operators(weights: Mapping[str, float]) -> list[tuple[Operator, float]]:
    """The embedded default: ``tweak`` and block ``crossover`` with the given weights (0 drops one)."""
    made: list[tuple[Operator, float]] = []
    if weights.get("tweak", 0) > 0:
        made.append((Tweak(), float(weights["tweak"])))
    if weights.get("crossover", 0) > 0:
        made.append((BlockCrossover(), float(weights["crossover"])))
    return made


def build_operators(
    weights: BuiltinWeights, client: LLMClient | None
) -> list[tuple[Operator, float]]:
    """All operators of a run with their weights.

    Args:
        weights: the ``operators.builtin`` weights.
        client: the run's LLM client, shared by one diff/rewrite/crossover per model its
            ``llm`` settings name; None: no model is configured.

    Raises:
        ConfigError: no operator has a weight above 0 and no model is configured.
    """
    operators = builtin_operators(weights.as_dict())
    if client is not None:
        from evolve.operators.llm_catalog import llm_operators

        operators += llm_operators(client)
    if not operators:
        raise ConfigError(
            "no operators: set operators.builtin weights above 0 or configure an LLM (llm=...)"
        )
    return operators
