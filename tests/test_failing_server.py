"""A server failing every call ends the run with that reason and a non-zero exit, never
``finished``; a resume restating the run's own config is accepted."""

from __future__ import annotations

import sqlite3

import pytest

from evolve import runner
from evolve.llm import LLMStop
from tests.conftest import composed
from tests.fixtures.mock_openai import MockServer

LLM_ONLY = ["operators.builtin.tweak=0", "operators.builtin.crossover=0", "search.workers=1"]


def test_a_server_failing_every_call_ends_the_run_with_its_error_not_finished(tmp_path) -> None:
    server = MockServer(failing=True).start()
    try:
        cfg = composed(
            [
                "llm=local",
                f"llm.api_base={server.api_base}",
                "llm.model=openai/scripted",
                "llm.retries=0",
                "search.max_candidates=5",
                *LLM_ONLY,
            ],
            toy=False,
        )
        with pytest.raises(LLMStop, match="every LLM call of this session failed.*server is gone"):
            runner.run(cfg, tmp_path)
    finally:
        server.stop()
    with sqlite3.connect(tmp_path / "archive.db") as db:
        assert db.execute("SELECT status FROM runs").fetchall() == [("failed",)]
