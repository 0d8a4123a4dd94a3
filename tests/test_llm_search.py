"""LLM operators inside real searches: circle packing through the command provider, a local server, replay."""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from evolve.launch import runner
from evolve.llm import LLMStop, PreflightError
from evolve.store.calls import prompt_messages
from evolve.store.database import Store
from evolve.types import CandidateStatus
from tests.conftest import REPO, composed, start_evolve
from tests.fixtures.mock_openai import MockServer

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
    assert any(
        "Earlier proposals from this program and what came of them" in prompt for prompt in prompts
    )


@pytest.mark.slow
def test_an_offline_replay_rebuilds_the_same_archive_without_calls(tmp_path) -> None:
    first_dir, replay_dir = tmp_path / "first", tmp_path / "replay"
    cfg = circle_packing(RUN)
    cfg["llm"].update(command=SCRIPTED, operators=OPERATORS)
    first = runner.run(cfg, first_dir)
    cfg = circle_packing(RUN)
    # the same command names the same model (command/...): offline, it is never started
    cfg["llm"].update(
        command=SCRIPTED, offline=True, replay_from=str(first_dir), operators=OPERATORS
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


def test_a_search_through_a_local_openai_compatible_server(tmp_path) -> None:
    server = MockServer().start()
    try:
        cfg = composed(
            [
                "llm=local",
                f"llm.api_base={server.api_base}",
                "llm.model=openai/scripted",
                "search.max_candidates=5",
                *LLM_ONLY,
            ],
            toy=False,
        )
        summary = runner.run(cfg, tmp_path)
    finally:
        server.stop()
    assert summary.evaluated == 5
    assert server.models and server.models[0] == "scripted"
    calls = rows(
        tmp_path / "archive.db", "SELECT model, tokens_in, tokens_out, error FROM llm_calls"
    )
    assert len(calls) == server.requests
    assert all(
        m == "openai/scripted" and tin > 0 and tout > 0 and e is None for m, tin, tout, e in calls
    )
    made = rows(
        tmp_path / "archive.db", "SELECT COUNT(*) FROM candidates WHERE model='openai/scripted'"
    )
    assert made[0][0] >= 1


# --- many proposals in flight (issue 16) ------------------------------------------------------------


def local_toy(server: MockServer, *overrides: str) -> dict:
    """The toy benchmark proposed by the mock server through litellm (llm=local)."""
    return composed(
        [
            "llm=local",
            f"llm.api_base={server.api_base}",
            "llm.model=openai/scripted",
            "operators.builtin.tweak=0",
            "operators.builtin.crossover=0",
            "archive.islands=2",
            *overrides,
        ]
    )


def candidates(run_dir: Path) -> list[tuple]:
    return rows(
        run_dir / "archive.db",
        "SELECT c.seq, c.id, c.status, v.status, v.fitness FROM candidates c LEFT JOIN evaluations v "
        "ON v.candidate = c.id AND v.stage != 'reevaluation' ORDER BY c.seq",
    )


def test_proposals_are_in_flight_at_once_up_to_the_setting(tmp_path) -> None:
    server = MockServer().start()
    server.open.clear()  # hold every request until four are in flight
    released = threading.Thread(target=lambda: server.wait_in_flight(4) and server.open.set())
    released.start()
    try:
        cfg = local_toy(server, "search.max_candidates=12", "search.workers=2")
        cfg["search"]["max_proposals_in_flight"] = 4
        summary = runner.run(cfg, tmp_path)
    finally:
        server.open.set()
        released.join()
        server.stop()
    assert server.max_in_flight == 4 and summary.evaluated == 12
    assert Store(tmp_path / "archive.db", readonly=True).integrity_problems() == []


def test_an_offline_replay_of_a_concurrent_run_makes_the_same_candidates(tmp_path) -> None:
    server = MockServer(jitter_s=0.05).start()  # answers come back out of order
    try:
        cfg = local_toy(server, "search.max_candidates=30", "search.workers=2")
        cfg["search"]["max_proposals_in_flight"] = 4
        first = runner.run(cfg, tmp_path / "first")
    finally:
        server.stop()
    cfg = local_toy(server, "search.max_candidates=30", "search.workers=2")
    cfg["search"]["max_proposals_in_flight"] = 4
    cfg["llm"].update(offline=True, replay_from=str(tmp_path / "first"))
    replay = runner.run(cfg, tmp_path / "replay")
    original = candidates(tmp_path / "first")
    assert len(original) > 30 and candidates(tmp_path / "replay") == original
    assert (replay.best, replay.best_id) == (first.best, first.best_id)
    told = "SELECT seq FROM schedule WHERE told IS NOT NULL ORDER BY told"
    assert rows(tmp_path / "replay" / "archive.db", told) == rows(
        tmp_path / "first" / "archive.db", told
    )
    assert rows(tmp_path / "first" / "archive.db", told) != sorted(
        rows(tmp_path / "first" / "archive.db", told)
    ), "results were told in proposal order: the run did not overlap anything"


def test_kill_9_with_calls_in_flight_then_resume_loses_and_repeats_nothing(tmp_path) -> None:
    server = MockServer(hold_after=10).start()  # from the 11th call on, calls are held in flight
    run_dir = tmp_path / "run"
    args = [
        sys.executable,
        "-m",
        "evolve",
        "--config-dir",
        "tests/fixtures/evolve_configs",
        "benchmark=toy",
        "search.progress=false",
        "llm=local",
        f"llm.api_base={server.api_base}",
        "llm.model=openai/scripted",
        "operators.builtin.tweak=0",
        "operators.builtin.crossover=0",
        "search.max_candidates=24",
        "search.workers=2",
        "search.max_proposals_in_flight=4",
        # Only proposals reach the gate: a would-be best's model review held there would count
        # in the window (in flight + slots - 1 unfinished) and leave fewer proposals in flight.
        "audit.review=false",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        proc = start_evolve(args, run_dir)
        assert server.wait_in_flight(4, timeout_s=240)  # of the 14 proposals still to ask
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        db = run_dir / "archive.db"
        in_flight = rows(
            db,
            "SELECT COUNT(*) FROM schedule s LEFT JOIN candidates c ON c.seq = s.seq "
            "WHERE c.seq IS NULL",
        )[0][0]
        assert in_flight >= 1, "no call was in flight when the run was killed"
        server.open.set()
        resume = [a for a in args if not a.startswith(("llm=", "llm.model", "operators."))]
        resumed = subprocess.run(
            [*resume, f"resume={run_dir}"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        server.stop()
    assert resumed.returncode == 0, resumed.stderr
    assert (
        resumed.stdout.count("again (it was in flight")
        + resumed.stderr.count("again (it was in flight")
        == in_flight
    )
    store = Store(db, readonly=True)
    assert store.integrity_problems() == []
    seqs = [seq for seq, *_ in candidates(run_dir)]
    assert seqs == list(range(len(seqs)))  # every proposal asked ended as a candidate: none lost
    assert store.count(CandidateStatus.DONE) + store.count(CandidateStatus.FAILED) == 24
    paid_twice = "SELECT cache_key FROM llm_calls WHERE response IS NOT NULL GROUP BY cache_key HAVING COUNT(*) > 1"
    assert rows(db, paid_twice) == []


def test_a_server_that_is_gone_ends_the_run_naming_the_cause_and_the_run(tmp_path) -> None:
    server = MockServer(failing=True).start()
    try:
        cfg = local_toy(server, "search.max_candidates=200", "search.workers=1", "llm.retries=0")
        with pytest.raises(LLMStop) as stopped:  # not "finished": the CLI exits non-zero with it
            runner.run(cfg, tmp_path)
    finally:
        server.stop()
    reason = str(stopped.value)
    assert reason.startswith("every LLM call of this session failed (50 proposals in a row were ")
    assert "the model server is gone" in reason
    assert f"python -m evolve.browse {tmp_path} stats" in reason and " RUN " not in reason
    assert rows(tmp_path / "archive.db", "SELECT status FROM runs") == [("failed",)]


def test_an_answer_that_reproduces_a_stored_program_is_not_asked_again(tmp_path, caplog) -> None:
    edit = "<<<<<<< SEARCH\nA = 1.0\n=======\nA = 2.0\n>>>>>>> REPLACE\n"
    server = MockServer(answer=f"Raise A.\n\n{edit}").start()
    try:
        cfg = local_toy(server, "search.max_candidates=40", "search.workers=1", "archive.islands=1")
        with caplog.at_level(logging.INFO, logger="evolve"):
            summary = runner.run(cfg, tmp_path)
    finally:
        server.stop()
    db = tmp_path / "archive.db"
    duplicates = rows(
        db, "SELECT COUNT(*) FROM candidates WHERE description LIKE '%reproduces candidate%'"
    )
    assert duplicates[0][0] >= 2
    assert any("reproduces candidate" in r.getMessage() for r in caplog.records)
    asked = rows(db, "SELECT prompt_hash FROM llm_calls")  # the hash of the messages sent
    assert len(asked) == len(set(asked)), "an identical prompt was asked twice"
    assert "converged" not in summary.reason
