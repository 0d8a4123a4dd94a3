"""The auditor's model review in a run: a verdict on each audited change, through the run's LLM client.

The runs are those of ``tests/test_audit_stage.py`` (real engine, driver, local backend and
toy fitness; child 1 a clean new best, child 2 a new best that adds ``import ctypes``) with a
real ``command`` model (``tests/fixtures/review_model.py``) that answers every review prompt
with one fixed verdict.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys

import pytest
from click.testing import CliRunner

from evolve.browse.cli import main as browse
from evolve.launch import runner
from evolve.llm import LLMSettings
from evolve.research.review import parse_review
from evolve.store.calls import prompt_messages
from evolve.types import CandidateStatus
from tests.conftest import REPO, composed
from tests.test_audit_stage import TASK, audits, by_seq, search, stages

MODEL = REPO / "tests" / "fixtures" / "review_model.py"


def model(answer: str, **settings) -> LLMSettings:
    return LLMSettings.from_config(
        {"model": "command", "command": f"{sys.executable} {MODEL} --answer {answer}", **settings}
    )


def reviews(store) -> dict[int, tuple]:
    rows = store.conn.execute(
        "SELECT c.seq, a.review_verdict, a.review, a.review_model, a.review_prompt_hash "
        "FROM audits a JOIN candidates c ON c.id = a.candidate"
    )
    return {seq: tuple(rest) for seq, *rest in rows}


def test_a_clean_review_lets_a_clean_new_best_be_promoted(tmp_path) -> None:
    store = search(tmp_path, llm=model("clean"))
    verdict, reasons, reviewer, phash = reviews(store)[1]
    assert (verdict, reviewer) == ("clean", "command/review_model")
    assert reasons == "- the change adds `B = 8`"
    flagged, decision, flags, strict_fitness, _ = audits(store)[1]
    assert (flagged, decision, flags, strict_fitness) == (False, "clean", [], None)
    assert [(stage, status) for stage, status, *_ in stages(store, 1)] == [("full", "ok")]
    # the statically flagged child is still re-evaluated strictly, whatever the model says
    assert audits(store)[2][1] == "promoted" and reviews(store)[2][0] == "clean"
    # the call went through the client: recorded with its prompt (the task's rules and the diff)
    (call_id, tokens_in), *more = store.conn.execute(
        "SELECT id, tokens_in FROM llm_calls WHERE prompt_hash = ? AND error IS NULL", (phash,)
    ).fetchall()
    assert not more and tokens_in > 0
    prompt = prompt_messages(store.conn, call_id)[0]["content"]
    assert TASK in prompt and "-B = 4\n+B = 8" in prompt
    assert "It scored -20.0625; the run's best so far is -68.0625 (a gain of +48)" in prompt
    assert "VERDICT: clean" in prompt and "static detectors" not in prompt
    flagged_prompt = store.conn.execute(
        "SELECT review_prompt_hash FROM audits a JOIN candidates c ON c.id = a.candidate WHERE seq = 2"
    ).fetchone()[0]
    call = store.conn.execute("SELECT id FROM llm_calls WHERE prompt_hash = ?", (flagged_prompt,))
    assert (
        "[native-code] imports ctypes"
        in prompt_messages(store.conn, call.fetchone()[0])[0]["content"]
    )


def test_a_suspicious_review_triggers_a_strict_evaluation_and_is_shown(tmp_path) -> None:
    store = search(tmp_path, llm=model("suspicious"))
    clean_id = by_seq(store, 1)
    flagged, decision, flags, strict_fitness, reason = audits(store)[1]
    assert flagged and decision == "promoted" and flags == [] and reason == ""
    assert strict_fitness == pytest.approx(-20.0625)
    assert [(stage, status) for stage, status, *_ in stages(store, 1)] == [
        ("strict", "ok"),
        ("full", "ok"),
    ]
    assert reviews(store)[1][:2] == ("suspicious", "- the change adds `B = 8`")
    store.close()
    runner = CliRunner()
    shown = runner.invoke(browse, [str(tmp_path), "show", clean_id, "--json"])
    assert shown.exit_code == 0, shown.output
    review = json.loads(shown.output)["audit"]["review"]
    assert (review["verdict"], review["model"]) == ("suspicious", "command/review_model")
    text = runner.invoke(browse, [str(tmp_path), "show", clean_id]).output
    assert "verdict: flagged, promoted" in text
    assert "model review by command/review_model: suspicious" in text
    assert "- the change adds `B = 8`" in text
    rows = json.loads(runner.invoke(browse, [str(tmp_path), "best", "--json"]).output)
    assert {row["seq"]: row["audit"] for row in rows}[2] == "flagged, promoted"


def test_a_suspicious_review_refuses_what_the_strict_evaluation_does_not_confirm(tmp_path) -> None:
    store = search(tmp_path, penalty=100.0, llm=model("suspicious"))
    _, decision, _, _, reason = audits(store)[1]
    assert decision == "refused"
    assert reason.startswith(
        "auditor: flagged, then refused; flags: model review by command/review_model: suspicious; "
        "strict re-evaluation: strict fitness"
    )
    assert store.candidate(by_seq(store, 1)).status == CandidateStatus.FAILED
    _, decision, _, _, reason = audits(store)[2]  # now the best would be the seed: refused too
    assert decision == "refused" and reason.startswith(
        "auditor: flagged, then refused; flags: native-code at params.py:3; model review by "
        "command/review_model: suspicious;"
    )


def test_a_malformed_answer_is_recorded_and_is_no_verdict(tmp_path) -> None:
    store = search(tmp_path, llm=model("malformed"))
    verdict, reasons, *_ = reviews(store)[1]
    assert verdict == "malformed"
    assert reasons == "The change looks fine to me; it edits `B = 8`."
    assert audits(store)[1][1] == "clean"  # no verdict: the static one stands
    assert [(stage, status) for stage, status, *_ in stages(store, 1)] == [("full", "ok")]
    flagged, decision, *_ = audits(store)[2]  # static flags still mean a strict evaluation
    assert flagged and decision == "promoted" and reviews(store)[2][0] == "malformed"
    assert [(stage, status) for stage, status, *_ in stages(store, 2)] == [
        ("strict", "ok"),
        ("full", "ok"),
    ]


FAILING = {"model": "command", "command": "false", "retries": 0}
OVER_BUDGET = {**FAILING, "max_cost_usd": 0.0001, "pricing": {"input_per_mtok": 100.0}}


@pytest.mark.parametrize(("settings", "why"), [(FAILING, "false"), (OVER_BUDGET, "max_cost_usd")])
def test_a_review_without_an_answer_is_recorded_and_the_run_goes_on(
    tmp_path, settings, why
) -> None:
    store = search(tmp_path, llm=LLMSettings.from_config(dict(settings)))
    verdict, reasons, reviewer, _ = reviews(store)[1]
    assert (verdict, reviewer) == ("unavailable", "command/false") and why in reasons
    assert audits(store)[1][1] == "clean" and audits(store)[2][1] == "promoted"


def test_an_offline_replay_reproduces_the_reviews_without_calls(tmp_path) -> None:
    original = search(tmp_path / "first", penalty=100.0, llm=model("suspicious"))
    recorded = reviews(original), audits(original)
    original.close()
    replay = LLMSettings.from_config(  # the same model name; its command would fail if called
        {
            "model": "command/review_model",
            "commands": {"review_model": "false"},
            "offline": True,
            "replay_from": str(tmp_path / "first" / "archive.db"),
        }
    )
    store = search(tmp_path / "second", penalty=100.0, llm=replay)
    assert (reviews(store), audits(store)) == recorded
    assert [v[0] for v in recorded[0].values()] == [
        "suspicious"
    ] * 3  # #3 too, once both are refused
    calls = "SELECT COUNT(*), SUM(cost), SUM(error IS NOT NULL) FROM llm_calls"
    assert store.conn.execute(calls).fetchone() == (3, 0.0, 0)  # the recorded answers, copied


def test_a_verdict_line_may_be_marked_up_but_must_come_first() -> None:
    assert (
        parse_review("**VERDICT: Suspicious**\n- x", model="m", prompt_hash="h").verdict
        == "suspicious"
    )
    assert parse_review("  verdict: clean  ", model="m", prompt_hash="h").reasons == ""
    late = parse_review("Looks fine.\nVERDICT: clean", model="m", prompt_hash="h")
    assert (late.verdict, late.reasons) == ("malformed", "Looks fine.\nVERDICT: clean")
    assert parse_review("VERDICT: cleanish", model="m", prompt_hash="h").verdict == "malformed"
    assert parse_review("", model="m", prompt_hash="h").reasons == "(empty answer)"


def test_the_candidate_page_shows_the_review(tmp_path) -> None:
    from evolve.browse.web.server import make_app

    store = search(tmp_path, llm=model("suspicious"))
    clean_id = by_seq(store, 1)
    store.close()
    app = make_app(tmp_path / "archive.db")
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(app.invoke_startup())
        response = loop.run_until_complete(app.client.get(f"/-/evolve/c/{clean_id}"))
        assert response.status_code == 200
        page = response.text
        assert "<strong>flagged, promoted</strong>" in page
        assert "Model review by command/review_model: <strong>suspicious</strong>" in page
        assert "- the change adds `B = 8`" in page
    finally:
        loop.close()


@pytest.mark.parametrize("review", [True, False])
def test_a_run_with_a_model_has_it_review_each_new_best(tmp_path, review) -> None:
    cfg = composed(
        [
            "llm=command",
            "operators.builtin.tweak=0",
            "operators.builtin.crossover=0",
            "search.workers=1",
            "search.max_candidates=8",
            f"audit.review={str(review).lower()}",
        ]
    )
    cfg["llm"].update(command=f"{sys.executable} {MODEL} --answer clean --seed 0")
    runner.run(cfg, tmp_path)
    with sqlite3.connect(tmp_path / "archive.db") as db:
        rows = db.execute("SELECT review_verdict, review_model FROM audits").fetchall()
        prompts = {h for (h,) in db.execute("SELECT prompt_hash FROM llm_calls")}
        hashes = {h for (h,) in db.execute("SELECT review_prompt_hash FROM audits")}
    assert rows  # the toy improves on its seed within a few proposals
    if review:
        assert set(rows) == {("clean", "command/review_model")} and hashes <= prompts
    else:
        assert set(rows) == {(None, None)}
