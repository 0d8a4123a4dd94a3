"""The LLM client over the real litellm call path: recording, retries, cost, budget, cache, replay."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from evolve.llm import (
    BudgetExceeded,
    LLMCallFailed,
    LLMClient,
    LLMConfigError,
    LLMSettings,
    LLMStop,
    ReplayMiss,
)
from evolve.store.calls import prompt_messages
from evolve.store.database import Store
from tests.fixtures import scripted_provider

MESSAGES = [
    {"role": "system", "content": "You edit programs."},
    {"role": "user", "content": "make it faster"},
]


@pytest.fixture
def scripted() -> scripted_provider.ScriptedLLM:
    return scripted_provider.install()


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "archive.db")


def settings(**overrides) -> LLMSettings:
    base = {
        "model": "scripted/m",
        "retries": 2,
        "backoff_s": 0.01,
        "backoff_max_s": 0.05,
        "timeout_s": 5,
    }
    return LLMSettings.from_config(base | overrides)


def calls(store: Store) -> list[dict]:
    return list(store.db.query("SELECT * FROM llm_calls ORDER BY id"))


def run(coro):
    return asyncio.run(coro)


def test_a_call_is_recorded_with_messages_usage_and_latency(scripted, store) -> None:
    scripted.queue("m", {"answer": "use numpy", "tokens_in": 12, "tokens_out": 3})
    client = LLMClient(settings(), store=store)
    answer = run(client.complete("scripted/m", MESSAGES, sample=0, prompt_hash="p1"))
    assert answer.text == "use numpy" and not answer.cached and answer.cost is None
    (row,) = calls(store)
    assert prompt_messages(store.conn, row["id"]) == MESSAGES and row["status"] == "ok"
    assert (row["response"], row["tokens_in"], row["tokens_out"], row["error"]) == (
        "use numpy",
        12,
        3,
        None,
    )
    assert row["prompt_hash"] == "p1" and row["latency_s"] >= 0 and row["cost"] is None
    _, _, params = scripted.requests[0]
    assert params["temperature"] == 0.8 and params["max_tokens"] == 4096


def test_cost_comes_from_litellms_price_map(scripted, store) -> None:
    scripted_provider.register_price(input_per_token=1e-6, output_per_token=2e-6)
    scripted.queue("priced", {"answer": "x", "tokens_in": 1000, "tokens_out": 500})
    client = LLMClient(settings(model=scripted_provider.PRICED), store=store)
    answer = run(client.complete(scripted_provider.PRICED, MESSAGES, sample=0, prompt_hash="p"))
    assert answer.cost == pytest.approx(1000 * 1e-6 + 500 * 2e-6)
    assert calls(store)[0]["cost"] == pytest.approx(0.002)
    assert client.spent() == pytest.approx(0.002)


def test_configured_pricing_overrides_and_spent_survives_a_restart(scripted, store) -> None:
    scripted.queue("m", {"answer": "a", "tokens_in": 2_000_000, "tokens_out": 1_000_000})
    cfg = settings(pricing={"input_per_mtok": 0.5, "output_per_mtok": 2.0})
    run(LLMClient(cfg, store=store).complete("scripted/m", MESSAGES, sample=0, prompt_hash="p"))
    assert LLMClient(cfg, store=store).spent() == pytest.approx(3.0)


def test_rate_limits_are_retried_honouring_retry_after(scripted, store) -> None:
    scripted.queue("m", {"rate_limit": 0.2}, {"status": 503}, "done")
    client = LLMClient(settings(), store=store)
    answer = run(client.complete("scripted/m", MESSAGES, sample=0, prompt_hash="p"))
    assert answer.text == "done" and client.attempts == 3
    assert client.waits[0] >= 0.2 and client.waits[1] < 0.2
    rows = calls(store)
    assert [r["error"] is None for r in rows] == [False, False, True]
    assert "RateLimitError" in rows[0]["error"] and "ServiceUnavailableError" in rows[1]["error"]


def test_retries_run_out_and_every_attempt_is_recorded(scripted, store) -> None:
    scripted.queue("m", {"rate_limit": 0}, {"rate_limit": 0}, {"rate_limit": 0}, "never reached")
    client = LLMClient(settings(retries=2), store=store)
    with pytest.raises(LLMCallFailed, match="attempt 3 of 3"):
        run(client.complete("scripted/m", MESSAGES, sample=0, prompt_hash="p"))
    assert len(calls(store)) == 3 and all("RateLimitError" in r["error"] for r in calls(store))


def test_a_timeout_is_retried_then_recorded(scripted, store) -> None:
    scripted.queue("m", {"sleep": 3}, {"sleep": 3})
    client = LLMClient(settings(retries=1, timeout_s=0.3), store=store)
    with pytest.raises(LLMCallFailed):
        run(client.complete("scripted/m", MESSAGES, sample=0, prompt_hash="p"))
    rows = calls(store)
    assert len(rows) == 2 and all("Timeout" in r["error"] for r in rows)
    assert all(r["latency_s"] < 2.5 for r in rows)


def test_a_bad_request_is_not_retried(scripted, store) -> None:
    scripted.queue("m", {"status": 400}, "unused")
    client = LLMClient(settings(), store=store)
    with pytest.raises(LLMCallFailed, match="BadRequestError"):
        run(client.complete("scripted/m", MESSAGES, sample=0, prompt_hash="p"))
    assert client.attempts == 1


def test_an_auth_error_stops_the_run_and_names_the_fix(scripted, store) -> None:
    scripted.queue("m", {"status": 401})
    with pytest.raises(LLMStop, match="API key"):
        run(
            LLMClient(settings(), store=store).complete(
                "scripted/m", MESSAGES, sample=0, prompt_hash="p"
            )
        )


def test_empty_and_huge_answers_come_back_whole_and_a_huge_one_is_stored_cut(
    scripted, store
) -> None:
    huge = "head\n" + "x = 1\n" * 350_000 + "tail"  # 2.1 MB
    scripted.queue("m", "", huge)
    client = LLMClient(settings(), store=store)
    assert run(client.complete("scripted/m", MESSAGES, sample=0, prompt_hash="p")).text == ""
    assert run(client.complete("scripted/m", MESSAGES, sample=1, prompt_hash="p")).text == huge
    stored = calls(store)[1]
    assert stored["answer_chars"] == len(huge) and len(stored["response"]) < 210_000
    assert stored["response"].startswith("head\n") and stored["response"].endswith("tail")
    assert f"of {len(huge)} characters" in stored["response"]


def test_the_budget_stops_calls_before_they_can_exceed_it(scripted, store) -> None:
    import litellm

    scripted_provider.register_price(input_per_token=1e-6, output_per_token=1e-4)
    tokens_in = litellm.token_counter(model=scripted_provider.PRICED, messages=MESSAGES)
    for _ in range(10):  # every answer uses all of max_tokens: $0.01 + the prompt per call
        scripted.queue("priced", {"answer": "ok", "tokens_in": tokens_in, "tokens_out": 100})
    client = LLMClient(
        settings(model=scripted_provider.PRICED, max_cost_usd=0.035, max_tokens=100), store=store
    )
    made = 0
    with pytest.raises(BudgetExceeded, match=r"llm.max_cost_usd=\$0.035"):
        for sample in range(10):
            run(client.complete(scripted_provider.PRICED, MESSAGES, sample=sample, prompt_hash="p"))
            made += 1
    per_call = tokens_in * 1e-6 + 100 * 1e-4
    assert made == 3 and client.spent() == pytest.approx(3 * per_call) and client.spent() <= 0.035
    assert len(calls(store)) == 3 and sum(r["cost"] for r in calls(store)) == pytest.approx(
        3 * per_call
    )


def test_the_budget_counts_the_answer_cap_that_llm_params_sends(scripted, store) -> None:
    scripted_provider.register_price(input_per_token=0.0, output_per_token=1e-6)
    scripted.queue("priced", {"answer": "long", "tokens_out": 180_000})
    client = LLMClient(
        settings(
            model=scripted_provider.PRICED,
            max_cost_usd=0.05,
            max_tokens=100,
            params={"max_tokens": 200_000},
        ),
        store=store,
    )
    assert client.worst_case_cost(scripted_provider.PRICED, MESSAGES) >= 200_000 * 1e-6
    with pytest.raises(BudgetExceeded, match="is expected to cost"):
        run(client.complete(scripted_provider.PRICED, MESSAGES, sample=0, prompt_hash="p"))
    assert scripted.requests == [] and client.spent() == 0


def test_a_zero_budget_allows_no_call(scripted, store) -> None:
    client = LLMClient(settings(max_cost_usd=0), store=store)
    with pytest.raises(BudgetExceeded):
        run(client.complete("scripted/m", MESSAGES, sample=0, prompt_hash="p"))
    assert scripted.requests == []


def test_recorded_answers_are_served_again_without_a_call(scripted, store, tmp_path) -> None:
    scripted.queue("m", "first", "second")
    client = LLMClient(settings(), store=store)
    run(client.complete("scripted/m", MESSAGES, sample=0, prompt_hash="p"))
    run(client.complete("scripted/m", MESSAGES, sample=1, prompt_hash="p"))
    store.close()
    resumed = LLMClient(settings(), store=Store(tmp_path / "archive.db"))
    again = [
        run(resumed.complete("scripted/m", MESSAGES, sample=s, prompt_hash="p")) for s in (0, 1)
    ]
    assert [a.text for a in again] == ["first", "second"] and all(a.cached for a in again)
    assert resumed.attempts == 0 and len(scripted.requests) == 2
    # a different temperature is a different request
    other = LLMClient(settings(temperature=0.1), store=Store(tmp_path / "archive.db"))
    with pytest.raises(LLMCallFailed):
        run(other.complete("scripted/m", MESSAGES, sample=0, prompt_hash="p"))


def test_failed_attempts_are_not_served_from_the_cache(scripted, store) -> None:
    scripted.queue("m", {"status": 400}, "fine")
    client = LLMClient(settings(), store=store)
    with pytest.raises(LLMCallFailed):
        run(client.complete("scripted/m", MESSAGES, sample=0, prompt_hash="p"))
    assert run(client.complete("scripted/m", MESSAGES, sample=0, prompt_hash="p")).text == "fine"


def test_offline_replay_from_another_archive(scripted, store, tmp_path) -> None:
    scripted.queue("m", "recorded")
    run(
        LLMClient(settings(), store=store).complete(
            "scripted/m", MESSAGES, sample=0, prompt_hash="p"
        )
    )
    replay_store = Store(tmp_path / "replay.db")
    client = LLMClient(
        settings(offline=True, replay_from=str(tmp_path / "archive.db")), store=replay_store
    )
    answer = run(client.complete("scripted/m", MESSAGES, sample=0, prompt_hash="p"))
    assert answer.text == "recorded" and answer.cached and len(scripted.requests) == 1
    assert [r["response"] for r in replay_store.db.query("SELECT response FROM llm_calls")] == [
        "recorded"
    ]
    with pytest.raises(ReplayMiss, match="llm.offline=false"):
        run(client.complete("scripted/m", MESSAGES, sample=1, prompt_hash="p"))
    assert len(scripted.requests) == 1


def test_online_replay_serves_only_answers_to_the_same_prompt(scripted, store, tmp_path) -> None:
    scripted.queue("m", "answer to the first prompt", "a fresh answer")
    run(
        LLMClient(settings(), store=store).complete(
            "scripted/m", MESSAGES, sample=0, prompt_hash="p"
        )
    )
    client = LLMClient(
        settings(replay_from=str(tmp_path / "archive.db")), store=Store(tmp_path / "online.db")
    )
    same = run(client.complete("scripted/m", MESSAGES, sample=0, prompt_hash="p"))
    assert same.text == "answer to the first prompt" and same.cached and len(scripted.requests) == 1
    other = [{"role": "user", "content": "a different prompt"}]
    changed = run(client.complete("scripted/m", other, sample=0, prompt_hash="q"))
    assert changed.text == "a fresh answer" and not changed.cached and len(scripted.requests) == 2


def test_settings_reject_what_they_do_not_know() -> None:
    with pytest.raises(LLMConfigError, match="unknown llm settings"):
        LLMSettings.from_config({"model": "x/y", "temprature": 0.2})
    with pytest.raises(LLMConfigError, match="listed twice"):
        LLMSettings.from_config({"model": "x/y", "models": ["x/y"]})
    cfg = LLMSettings.from_config(
        {"models": [{"model": "a/b", "weight": 2}, "c/d"], "commands": {"me": "cat -"}}
    )
    assert cfg.models == (("a/b", 2.0), ("c/d", 1.0)) and cfg.commands == {"me": ("cat", "-")}
    assert not LLMSettings.from_config({"model": None}).enabled


def test_one_command_line_serves_every_command_model() -> None:
    cfg = LLMSettings.from_config(
        {
            "models": ["command/a", "command/b"],
            "command": "my-agent --print",
            "commands": {"b": "other"},
        }
    )
    assert cfg.commands == {"a": ("my-agent", "--print"), "b": ("other",)}


def test_a_replay_serves_each_sample_its_answer_even_if_measured_numbers_changed(
    scripted, store, tmp_path
) -> None:
    scripted.queue("m", "recorded")
    run(
        LLMClient(settings(), store=store).complete(
            "scripted/m", MESSAGES, sample=4, prompt_hash="p"
        )
    )
    changed = [MESSAGES[0], {"role": "user", "content": "make it faster (run_s: 1.86)"}]
    replay = LLMClient(
        settings(offline=True, replay_from=str(tmp_path / "archive.db")),
        store=Store(tmp_path / "r.db"),
    )
    assert run(replay.complete("scripted/m", changed, sample=4, prompt_hash="q")).text == "recorded"
    with pytest.raises(ReplayMiss):
        run(replay.complete("scripted/m", changed, sample=5, prompt_hash="q"))
    scripted.queue(
        "m", "fresh"
    )  # a run that is not a replay asks the model again when the prompt changed
    assert (
        run(
            LLMClient(settings(), store=store).complete(
                "scripted/m", changed, sample=4, prompt_hash="q"
            )
        ).text
        == "fresh"
    )


def test_litellm_logs_nothing_when_evolve_prices_and_tokens_are_counted_only_for_a_budget(
    scripted, store, monkeypatch
) -> None:
    import litellm
    from litellm.litellm_core_utils.litellm_logging import Logging

    logged, counted = [], []
    log_success = Logging.handle_sync_success_callbacks_for_async_calls
    count = litellm.token_counter
    monkeypatch.setattr(
        Logging,
        "handle_sync_success_callbacks_for_async_calls",
        lambda self, *a, **k: logged.append(1) or log_success(self, *a, **k),
    )
    monkeypatch.setattr(
        litellm, "token_counter", lambda *a, **k: counted.append(1) or count(*a, **k)
    )
    scripted_provider.register_price(input_per_token=1e-6, output_per_token=1e-6)
    scripted.queue("priced", "a", "b", "c")
    by_litellm = LLMClient(settings(model=scripted_provider.PRICED), store=store)
    run(by_litellm.complete(scripted_provider.PRICED, MESSAGES, sample=0, prompt_hash="p"))
    assert (
        len(logged) == 1 and counted == []
    )  # litellm prices it: its logging runs; no budget: no count
    by_evolve = LLMClient(
        settings(
            model=scripted_provider.PRICED, pricing={"input_per_mtok": 1, "output_per_mtok": 1}
        ),
        store=store,
    )
    run(by_evolve.complete(scripted_provider.PRICED, MESSAGES, sample=1, prompt_hash="p"))
    assert len(logged) == 1 and counted == []  # evolve prices it: litellm logs nothing
    budgeted = LLMClient(settings(model=scripted_provider.PRICED, max_cost_usd=1.0), store=store)
    run(budgeted.complete(scripted_provider.PRICED, MESSAGES, sample=2, prompt_hash="p"))
    assert len(counted) == 1  # a budget needs the prompt's tokens
