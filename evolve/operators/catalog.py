"""Builds the run's operators from its configuration: the built-in ones, plus LLM ones when a model is set."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evolve.fitness import Benchmark
from evolve.operators.base import Operator
from evolve.operators.builtin import BlockCrossover, Tweak
from evolve.store import Store


def builtin_operators(weights: Mapping[str, float]) -> list[tuple[Operator, float]]:
    """The embedded default: ``tweak`` and block ``crossover`` with the given weights (0 drops one)."""
    made: list[tuple[Operator, float]] = []
    if weights.get("tweak", 0) > 0:
        made.append((Tweak(), float(weights["tweak"])))
    if weights.get("crossover", 0) > 0:
        made.append((BlockCrossover(), float(weights["crossover"])))
    return made


def build_operators(
    cfg: Mapping[str, Any], *, store: Store, benchmark: Benchmark
) -> list[tuple[Operator, float]]:
    """All operators of a run with their weights.

    Args:
        cfg: the resolved run config (``operators.builtin`` weights, the ``llm`` group).
        store: where LLM calls are recorded and cached.
        benchmark: the problem (LLM prompts show its task).
    """
    operators = builtin_operators(cfg["operators"]["builtin"])
    if uses_llm(cfg):
        from evolve.operators.llm_catalog import (
            llm_operators,  # one diff/rewrite/crossover per model
        )

        operators += llm_operators(cfg["llm"], store=store)
    if not operators:
        raise ValueError(
            "no operators: set operators.builtin weights above 0 or configure an LLM (llm=...)"
        )
    return operators


def uses_llm(cfg: Mapping[str, Any]) -> bool:
    """True when the configuration names at least one model."""
    llm = cfg.get("llm") or {}
    return bool(llm.get("model") or llm.get("models"))
