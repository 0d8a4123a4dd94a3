"""The run's LLM operators: model x operator arms with weights, the one client they are handed, preflight."""

from __future__ import annotations

import asyncio

import pytest

from evolve.llm import LLMClient, LLMSettings, PreflightError, preflight
from evolve.operators.catalog import build_operators
from evolve.operators.llm_catalog import llm_operators
from evolve.search.emitters import arm_key
from evolve.settings import BuiltinWeights
from evolve.store.database import Store


def test_an_ensemble_gives_one_arm_per_model_and_operator(tmp_path) -> None:
    cfg = {
        "models": [
            {"model": "openai/gpt-4o-mini", "weight": 3},
            {"model": "anthropic/claude-sonnet-4-5", "weight": 1},
        ],
        "operators": {"diff": 1.0, "rewrite": 0.0, "crossover": 0.5},
    }
    client = LLMClient(LLMSettings.from_config(cfg), store=Store(tmp_path / "a.db"))
    made = llm_operators(client)
    arms = {arm_key(op.name, op.model): weight for op, weight in made}
    assert arms == {
        "diff@openai/gpt-4o-mini": 3.0,
        "crossover@openai/gpt-4o-mini": 1.5,
        "diff@anthropic/claude-sonnet-4-5": 1.0,
        "crossover@anthropic/claude-sonnet-4-5": 0.5,
    }
    assert all(op.client is client for op, _ in made)  # one budget, cache and record
    run = build_operators(BuiltinWeights(), client)
    assert [op.name for op, _ in run] == ["tweak", "crossover"] + [op.name for op, _ in made]
    assert all(op.client is client for op, _ in run[2:])
    assert [op.name for op, _ in build_operators(BuiltinWeights(), None)] == ["tweak", "crossover"]


def test_preflight_checks_every_model_of_the_run(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    settings = LLMSettings.from_config(
        {"models": ["openai/gpt-4o-mini", "anthropic/claude-sonnet-4-5"]}
    )
    made = llm_operators(LLMClient(settings, store=Store(tmp_path / "a.db")))
    with pytest.raises(PreflightError, match="ANTHROPIC_API_KEY"):
        asyncio.run(preflight(settings))
    assert asyncio.run(made[0][0].preflight()) is not None  # one operator checks only its own model
