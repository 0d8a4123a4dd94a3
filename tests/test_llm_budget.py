"""The budget holds both ways against a real HTTP server: most of it is spent, and calls in
flight pass it by at most one worst-case call each, a server ignoring ``max_tokens`` included."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from evolve.llm import BudgetExceeded, LLMClient, LLMSettings
from evolve.store.database import Store
from tests.fixtures.mock_openai import MockServer

PROMPT = [{"role": "user", "content": "improve this program\n" + "x = 1\n" * 1300}]
SLOTS, CAP, LIMIT = 4, 4096, 0.2  # a worst-case call is a third of the budget
PRICES = {"input_per_mtok": 3.0, "output_per_mtok": 15.0}  # a mid-range hosted model's list price


class Ignoring(MockServer):
    """Answers 500 words; every eighth answer is 200,000 words, whatever ``max_tokens`` says."""

    def reply(self, prompt: str, number: int) -> str:
        return " ".join(["tok"] * (200_000 if number % 8 == 0 else 500))


def spend(tmp_path: Path, server: MockServer) -> tuple[LLMClient, list[BaseException]]:
    """Keep SLOTS calls in flight until the budget refuses one; the client and the refusals."""
    settings = LLMSettings.from_config(
        {
            "model": "openai/scripted",
            "api_base": server.api_base,
            "max_tokens": CAP,
            "max_concurrency": SLOTS,
            "max_cost_usd": LIMIT,
            "pricing": PRICES,
            "retries": 0,
            "timeout_s": 60,
        }
    )
    client = LLMClient(settings, store=Store(tmp_path / "archive.db"))
    refusals: list[BaseException] = []

    async def worker(lane: int) -> None:
        for sample in range(lane, 10_000, SLOTS):
            try:
                await client.complete("openai/scripted", PROMPT, sample=sample, prompt_hash="p")
            except BudgetExceeded as exc:
                refusals.append(exc)
                return

    async def main() -> None:
        await asyncio.gather(*(worker(lane) for lane in range(SLOTS)))

    asyncio.run(main())
    return client, refusals


@pytest.mark.parametrize(
    "server_class", [MockServer, Ignoring], ids=["honest", "ignores-max-tokens"]
)
def test_four_calls_in_flight_spend_most_of_the_budget_and_pass_it_by_at_most_one_call_each(
    tmp_path, server_class
) -> None:
    server = server_class(answer=None if server_class is Ignoring else " ".join(["tok"] * 500))
    server.start()
    try:
        client, refusals = spend(tmp_path, server)
    finally:
        server.stop()
    worst = client.worst_case_cost("openai/scripted", PROMPT)
    rows = client.ledger.store.conn.execute(
        "SELECT tokens_out, cost, status FROM llm_calls"
    ).fetchall()
    assert refusals and all("budget reached" in str(r) for r in refusals)
    assert LIMIT * 0.8 <= client.spent() <= LIMIT + SLOTS * worst
    assert client.spent() == pytest.approx(sum(cost for _, cost, _ in rows))
    # no call was charged past its answer cap by more than one streamed chunk
    assert max(tokens for tokens, _, _ in rows) <= CAP + 60
    if server_class is Ignoring:
        assert any(tokens > CAP for tokens, _, _ in rows)  # cut answers, charged as received
