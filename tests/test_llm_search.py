"""LLM operators inside real searches: circle packing through the command provider, a local server, replay."""

from __future__ import annotations

import json
import sqlite3
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from evolve import runner
from evolve.callstore import prompt_messages
from evolve.llm import PreflightError
from evolve.store import Store
from tests.conftest import REPO, composed
from tests.fixtures import scripted_model

SCRIPTED = f"{sys.executable} {REPO / 'tests' / 'fixtures' / 'scripted_model.py'} --seed 0"
LLM_ONLY = ["operators.builtin.tweak=0", "operators.builtin.crossover=0", "search.workers=1"]
RUN = ["search.max_candidates=12", "emitter.selection=weights", "archive.islands=1"]
OPERATORS = {"diff": 1.0, "rewrite": 1.0, "crossover": 2.0}


def circle_packing(overrides: list[str]) -> dict:
    return composed(["llm=command", *LLM_ONLY, *overrides], toy=False)


def rows(db: Path, sql: str, *args) -> list[tuple]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return conn.execute(sql, args).fetchall()


@pytest.fixture(scope="module")
def command_run(tmp_path_factory) -> tuple[Path, object]:
    run_dir = tmp_path_factory.mktemp("command_run")
    cfg = circle_packing(
        ["search.max_candidates=16", "emitter.selection=weights", "archive.islands=1"]
    )
    cfg["llm"]["command"] = SCRIPTED
    cfg["llm"]["operators"] = {"diff": 1.0, "rewrite": 1.0, "crossover": 1.0}
    return run_dir, runner.run(cfg, run_dir)


def test_circle_packing_evolves_through_the_command_provider(command_run) -> None:
    run_dir, summary = command_run
    db = run_dir / "archive.db"
    made = dict(
        rows(
            db,
            "SELECT operator, COUNT(*) FROM candidates WHERE model='command/scripted_model' GROUP BY operator",
        )
    )
    assert set(made) == {"diff", "rewrite", "crossover"}, made
    assert summary.best > summary.seed_fitness, (summary.best, summary.seed_fitness)
    assert Store(db, readonly=True).integrity_problems() == []


def test_lineage_roles_are_right(command_run) -> None:
    db = command_run[0] / "archive.db"
    evaluated = rows(
        db, "SELECT id, operator FROM candidates WHERE model IS NOT NULL AND status = 'done'"
    )
    assert "crossover" in {operator for _, operator in evaluated}
    for child, operator in evaluated:
        roles = sorted(role for (role,) in rows(db, "SELECT role FROM edges WHERE child=?", child))
        assert roles == (["crossover", "crossover"] if operator == "crossover" else ["mutation"]), (
            operator,
            roles,
        )


def test_every_llm_candidate_has_its_call_and_prompt_recorded(command_run) -> None:
    db = command_run[0] / "archive.db"
    asked = rows(
        db,
        "SELECT id, prompt_hash FROM candidates WHERE model IS NOT NULL AND prompt_hash IS NOT NULL",
    )
    assert len(asked) >= 8
    for cid, prompt_hash in asked:
        calls = rows(
            db, "SELECT candidate, response, error FROM llm_calls WHERE prompt_hash=?", prompt_hash
        )
        assert calls and any(c[0] == cid for c in calls), cid
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        prompts = [
            json.dumps(prompt_messages(conn, call_id))
            for (call_id,) in conn.execute("SELECT id FROM llm_calls")
        ]
    assert prompts and all("EVOLVE-BLOCK" in prompt for prompt in prompts)
    # what was rejected before is shown to the model next time, with the reason
    assert any("Recent attempts on this program that failed" in prompt for prompt in prompts)


@pytest.mark.slow
def test_an_offline_replay_rebuilds_the_same_archive_without_calls(tmp_path) -> None:
    first_dir, replay_dir = tmp_path / "first", tmp_path / "replay"
    cfg = circle_packing(RUN)
    cfg["llm"].update(command=SCRIPTED, operators=OPERATORS)
    first = runner.run(cfg, first_dir)
    cfg = circle_packing(RUN)
    cfg["llm"].update(
        command="false", offline=True, replay_from=str(first_dir), operators=OPERATORS
    )
    summary = runner.run(cfg, replay_dir)
    query = (
        "SELECT c.id, c.status, v.status, v.fitness FROM candidates c "
        "LEFT JOIN evaluations v ON v.candidate = c.id AND v.stage != 'reevaluation' ORDER BY c.seq"
    )
    original, replayed = (
        rows(first_dir / "archive.db", query),
        rows(replay_dir / "archive.db", query),
    )
    # Identical as long as evaluations are: a timeout under load would change what follows.
    for was, now in zip(original, replayed, strict=False):
        assert was[:2] == now[:2]
        if was[2:] != now[2:]:
            break
    else:
        assert len(replayed) == len(original) and summary.best == first.best
    recorded = rows(
        replay_dir / "archive.db",
        "SELECT COALESCE(SUM(cost), 0), SUM(error IS NOT NULL) FROM llm_calls",
    )
    assert recorded == [(0, 0)]


def test_the_budget_ends_the_run_cleanly_and_says_why(tmp_path) -> None:
    cfg = circle_packing(["search.max_candidates=30"])
    # A prompt is about 2,500 tokens: about $0.000125 each at $0.05 per million; a few calls fit.
    cfg["llm"].update(
        command=SCRIPTED,
        max_cost_usd=0.0005,
        pricing={"input_per_mtok": 0.05, "output_per_mtok": 0.05},
    )
    summary = runner.run(cfg, tmp_path)
    assert "llm.max_cost_usd" in summary.reason and "resume" in summary.reason
    calls, spent = rows(tmp_path / "archive.db", "SELECT COUNT(*), SUM(cost) FROM llm_calls")[0]
    assert calls >= 1 and 0 < spent <= 0.0005 and summary.evaluated < 30
    assert Store(tmp_path / "archive.db", readonly=True).integrity_problems() == []


def test_a_bad_model_fails_before_anything_is_evaluated(tmp_path) -> None:
    cfg = composed(["llm.model=gpt-nonexistent-9", *LLM_ONLY], toy=False)
    with pytest.raises(PreflightError, match="<provider>/<model>"):
        runner.run(cfg, tmp_path)
    assert rows(tmp_path / "archive.db", "SELECT COUNT(*) FROM evaluations") == [(0,)]


class OpenAICompatible(BaseHTTPRequestHandler):
    """/v1/models and /v1/chat/completions, answering with the scripted model's edits."""

    requests: list[dict] = []

    def _send(self, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        self._send({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

    def do_POST(self) -> None:  # noqa: N802
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(request)
        prompt = "\n\n".join(m["content"] for m in request["messages"])
        import random

        text = scripted_model.answer(prompt, random.Random(len(type(self).requests)))
        self._send(
            {
                "id": f"cmpl-{len(type(self).requests)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": request["model"],
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": text},
                    }
                ],
                "usage": {
                    "prompt_tokens": len(prompt) // 4,
                    "completion_tokens": len(text) // 4,
                    "total_tokens": (len(prompt) + len(text)) // 4,
                },
            }
        )

    def log_message(self, *args) -> None:
        pass


def test_a_search_through_a_local_openai_compatible_server(tmp_path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), OpenAICompatible)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cfg = composed(
            [
                "llm=local",
                f"llm.api_base=http://127.0.0.1:{server.server_port}/v1",
                "llm.model=openai/scripted",
                "search.max_candidates=5",
                *LLM_ONLY,
            ],
            toy=False,
        )
        summary = runner.run(cfg, tmp_path)
    finally:
        server.shutdown()
    assert summary.evaluated == 5
    assert OpenAICompatible.requests and OpenAICompatible.requests[0]["model"] == "scripted"
    calls = rows(
        tmp_path / "archive.db", "SELECT model, tokens_in, tokens_out, error FROM llm_calls"
    )
    assert len(calls) == len(OpenAICompatible.requests)
    assert all(
        m == "openai/scripted" and tin > 0 and tout > 0 and e is None for m, tin, tout, e in calls
    )
    made = rows(
        tmp_path / "archive.db", "SELECT COUNT(*) FROM candidates WHERE model='openai/scripted'"
    )
    assert made[0][0] >= 1
