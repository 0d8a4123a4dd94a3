"""Many LLM calls in flight at once: provider slots, one shared Retry-After wait, the budget, cancellation."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from evolve.llm import BudgetExceeded, LLMClient, LLMSettings
from evolve.llm._litellm import litellm
from evolve.store.database import Store
from tests.fixtures import scripted_provider

MESSAGES = [{"role": "user", "content": "make it faster"}]


class RateLimitingServer(BaseHTTPRequestHandler):
    """OpenAI-compatible: the first ``wave`` requests, held until all are in flight together, get
    429 with Retry-After; every later one an answer. Records arrival times and requests in flight."""

    protocol_version = "HTTP/1.1"
    wave = 3
    retry_after_s = 3
    lock = threading.Lock()
    barrier: threading.Barrier
    arrivals: list[float]
    limited_at: list[float]
    active = 0
    most_active = 0

    @classmethod
    def reset(cls) -> None:
        cls.barrier = threading.Barrier(cls.wave, timeout=60)
        cls.arrivals, cls.limited_at, cls.active, cls.most_active = [], [], 0, 0

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _send(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cls = type(self)
        with cls.lock:
            number = len(cls.arrivals)
            cls.arrivals.append(time.monotonic())
            cls.active += 1
            cls.most_active = max(cls.most_active, cls.active)
        if number < cls.wave:
            cls.barrier.wait()  # the whole first wave is in flight at once
            with cls.lock:
                cls.active -= 1
                cls.limited_at.append(time.monotonic())
            error = {"error": {"message": "slow down", "type": "rate_limit", "code": "rate_limit"}}
            self._send(429, error, {"Retry-After": str(cls.retry_after_s)})
            return
        with cls.lock:  # done before the answer leaves, so a next request never overlaps it
            cls.active -= 1
        self._send(
            200,
            {
                "id": f"c{number}",
                "object": "chat.completion",
                "created": 0,
                "model": request["model"],
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": f"a{number}"},
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
            },
        )

    def log_message(self, *args) -> None:
        pass


def test_a_429_with_retry_after_holds_every_call_of_the_provider_until_then(tmp_path) -> None:
    RateLimitingServer.reset()
    server = ThreadingHTTPServer(("127.0.0.1", 0), RateLimitingServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    calls, slots = 8, RateLimitingServer.wave
    settings = LLMSettings.from_config(
        {
            "model": "openai/m",
            "api_base": f"http://127.0.0.1:{server.server_port}/v1",
            "pricing": {"input_per_mtok": 0.0, "output_per_mtok": 0.0},
            "max_concurrency": slots,
            "retries": 2,
            "backoff_s": 0.01,
            "timeout_s": 60,
        }
    )
    client = LLMClient(settings, store=Store(tmp_path / "archive.db"))

    async def all_calls() -> list[str]:
        answers = await asyncio.gather(
            *(
                client.complete("openai/m", MESSAGES, sample=i, prompt_hash="p")
                for i in range(calls)
            )
        )
        await client.close()
        return [a.text for a in answers]

    try:
        answers = asyncio.run(all_calls())
    finally:
        server.shutdown()
    assert len(answers) == calls and all(a.startswith("a") for a in answers)
    arrivals, limited = RateLimitingServer.arrivals, RateLimitingServer.limited_at
    assert len(limited) == slots and len(arrivals) == calls + slots  # no retry inside litellm
    deadline = min(limited) + RateLimitingServer.retry_after_s
    assert all(t >= deadline for t in arrivals[slots:]), [round(t - deadline, 3) for t in arrivals]
    assert RateLimitingServer.most_active == slots
    rows = client.ledger.store.conn.execute(
        "SELECT status, COUNT(*) FROM llm_calls GROUP BY status"
    )
    assert dict(rows.fetchall()) == {"error": slots, "ok": calls}


@pytest.fixture
def scripted() -> scripted_provider.ScriptedLLM:
    return scripted_provider.install()


def priced_client(tmp_path: Path, **overrides) -> LLMClient:
    cfg = {"model": scripted_provider.PRICED, "retries": 0, "timeout_s": 30} | overrides
    return LLMClient(LLMSettings.from_config(cfg), store=Store(tmp_path / "archive.db"))


def test_the_budget_at_its_boundary_lets_exactly_the_calls_that_fit_start(
    scripted, tmp_path
) -> None:
    scripted_provider.register_price(input_per_token=1e-6, output_per_token=1e-4)
    client = priced_client(tmp_path, max_tokens=100, max_cost_usd=1.0)
    worst = client.worst_case_cost(scripted_provider.PRICED, MESSAGES)
    fit, calls = 3, 7
    limit = fit * worst + worst / 2  # room for three worst cases, not four
    client = priced_client(tmp_path, max_tokens=100, max_cost_usd=limit)
    tokens_in = litellm().token_counter(model=scripted_provider.PRICED, messages=MESSAGES)
    all_in, go = asyncio.Event(), asyncio.Event()
    scripted.on_request = lambda handler: all_in.set() if len(handler.requests) == fit else None
    for _ in range(calls):  # each answer uses its whole cap: real cost = worst case
        scripted.queue(
            "priced", {"wait": go, "answer": "ok", "tokens_in": tokens_in, "tokens_out": 100}
        )

    async def in_flight() -> list[object]:
        tasks = [
            asyncio.ensure_future(
                client.complete(scripted_provider.PRICED, MESSAGES, sample=i, prompt_hash="p")
            )
            for i in range(calls)
        ]
        await all_in.wait()
        assert client.budget.reserved == pytest.approx(fit * worst)
        go.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    results = asyncio.run(in_flight())
    refused = [r for r in results if isinstance(r, BudgetExceeded)]
    answered = [r for r in results if not isinstance(r, BaseException)]
    assert len(answered) == fit and len(refused) == calls - fit and len(scripted.requests) == fit
    assert "budget reached" in str(refused[0])
    assert client.spent() == pytest.approx(fit * worst) and client.spent() <= limit
    assert client.budget.reserved == pytest.approx(0)


def test_a_server_ignoring_max_tokens_is_charged_named_and_stopped(
    scripted, tmp_path, caplog
) -> None:
    scripted_provider.register_price(input_per_token=1e-6, output_per_token=1e-6)
    scripted.queue("priced", {"answer": "a very long answer", "tokens_out": 525_000}, "never asked")
    client = priced_client(tmp_path, max_tokens=1000, max_cost_usd=0.01)
    with caplog.at_level(logging.WARNING, logger="evolve.llm.client"):
        answer = asyncio.run(
            client.complete(scripted_provider.PRICED, MESSAGES, sample=0, prompt_hash="p")
        )
    assert answer.tokens_out == 525_000 and answer.cost == pytest.approx(0.525, rel=1e-3)
    assert client.spent() == pytest.approx(answer.cost)  # charged as reported
    assert any(
        scripted_provider.PRICED in r.message and "525000 completion tokens" in r.message
        for r in caplog.records
    )
    (row,) = client.ledger.store.conn.execute("SELECT tokens_out, cost FROM llm_calls").fetchall()
    assert row == (525_000, pytest.approx(0.525, rel=1e-3))
    with pytest.raises(BudgetExceeded, match="ignored the answer cap"):
        asyncio.run(client.complete(scripted_provider.PRICED, MESSAGES, sample=1, prompt_hash="p"))
    assert len(scripted.requests) == 1


def test_a_cancelled_call_is_recorded_as_possibly_billed(scripted, tmp_path) -> None:
    arrived, never = asyncio.Event(), asyncio.Event()
    scripted.on_request = lambda handler: arrived.set()
    scripted.queue("m", {"wait": never, "answer": "unreachable"})
    client = LLMClient(
        LLMSettings.from_config({"model": "scripted/m", "timeout_s": 60}),
        store=Store(tmp_path / "a.db"),
    )

    async def cancel_midway() -> None:
        task = asyncio.ensure_future(
            client.complete("scripted/m", MESSAGES, sample=0, prompt_hash="p")
        )
        await arrived.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_midway())
    (row,) = client.ledger.store.db.query(
        "SELECT status, error, tokens_in, response FROM llm_calls"
    )
    assert row["status"] == "cancelled" and "charged for the prompt" in row["error"]
    assert row["tokens_in"] > 0 and row["response"] is None
    summary = client.ledger.summary()["scripted/m"]
    assert (summary["calls"], summary["errors"], summary["cancelled"]) == (1, 0, 1)
