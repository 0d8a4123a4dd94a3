"""A replay of issue 31's circle-packing run: the limits a task states, its prescribed clock, the auditor.

A real run (runner, driver, local backend, the real circle-packing harness with a 1 CPU
second budget and a 10 s wall backstop) whose command model replays fixed programs
(``tests/fixtures/replay_model.py``), each the kind of candidate that run met:
1. a would-be best that searches until ``time.process_time()`` says its budget is spent (the
   clock TASK.md prescribes): audited, not flagged;
2. a would-be best flagged for another clock whose strict re-run the wall clock stops before
   its budget (it sleeps under any seed but its first: a starved machine, as the auditor
   sees it): run again, then unconfirmed, not refused, its first score kept;
3. a would-be best flagged for another clock that scores less under another seed: refused,
   its first score kept beside the decision, later prompts told only "flagged, then refused";
4. a program that waits past the wall backstop: its feedback names the wall limit and says
   the CPU budget was not reached;
5-7. plain programs, so that later prompts show what came of the others.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest

from evolve.archive.referee import INFRASTRUCTURE_RETRIES
from evolve.harness.audit import RULES
from evolve.launch import runner
from evolve.search.jobs import eval_seed
from evolve.store.calls import prompt_messages
from tests.conftest import REPO, composed

MODEL = REPO / "tests" / "fixtures" / "replay_model.py"
PROGRAM = """import json
import os
import sys
import time

# EVOLVE-BLOCK-START
R = {r}


def construct(n):
    seed = int(os.environ.get("EVOLVE_SEED", "0"))
{body}
    centres = [[((i % 6) + 0.5) / 6, ((i // 6) + 0.5) / 6] for i in range(n)]
    return centres, [radius] * n
# EVOLVE-BLOCK-END


def main():
    centres, radii = construct(int(sys.argv[1]))
    with open("packing.json", "w") as handle:
        json.dump({{"centers": centres, "radii": radii}}, handle)


main()
"""
PLAIN = "    radius = R"
SEARCH = (
    "    start = time.process_time()\n"
    "    while time.process_time() - start < 0.1:  # the clock TASK.md prescribes\n"
    "        pass\n" + PLAIN
)
OTHER_CLOCK = "    if time.monotonic() < 0:\n        return [], []\n"


def programs() -> dict[str, str]:
    first = {seq: eval_seed(0, seq) for seq in range(8)}
    return {
        "0": PROGRAM.format(r=0.05, body=PLAIN),
        "1": PROGRAM.format(r=0.06, body=SEARCH),
        "2": PROGRAM.format(
            r=0.07,
            body=OTHER_CLOCK + f"    if seed != {first[2]}:\n        time.sleep(600)\n" + PLAIN,
        ),
        "3": PROGRAM.format(
            r=0.075, body=OTHER_CLOCK + f"    radius = R if seed == {first[3]} else 0.055"
        ),
        "4": PROGRAM.format(r=0.076, body="    time.sleep(600)\n" + PLAIN),
        "5": PROGRAM.format(r=0.061, body=PLAIN),
        "6": PROGRAM.format(r=0.062, body=PLAIN),
        "7": PROGRAM.format(r=0.063, body=PLAIN),
    }


def rows(db: Path, sql: str, *args) -> list[tuple]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return conn.execute(sql, args).fetchall()


@pytest.fixture(scope="module")
def replay(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("replay")
    script = programs()
    (root / "script.json").write_text(json.dumps(script))
    (root / "seed").mkdir()
    (root / "seed" / "packing.py").write_text(script["0"])
    cfg = composed(
        [
            "benchmark=circle_packing",
            "llm=command",
            f"llm.command={sys.executable} {MODEL} --script {root / 'script.json'}",
            "llm.operators.diff=0",
            "llm.operators.crossover=0",
            "llm.operators.rewrite=1",
            "operators.builtin.tweak=0",
            "operators.builtin.crossover=0",
            "search.max_candidates=7",
            "search.workers=1",
            "noise.seeds=1",
        ],
        toy=False,
    )
    cfg["benchmark"].update(seed=str(root / "seed"), timeout_s=10)
    cfg["benchmark"]["fitness"]["cpu_budget_s"] = 1
    runner.run(cfg, root / "run")
    return root / "run" / "archive.db"


def by_seq(db: Path) -> dict[int, tuple]:
    return {
        seq: rest
        for seq, *rest in rows(
            db,
            "SELECT c.seq, c.status, a.decision, a.flags, v.status, v.fitness, "
            "json_extract(v.artifacts, '$.error') FROM candidates c "
            "LEFT JOIN audits a ON a.candidate = c.id "
            "JOIN evaluations v ON v.candidate = c.id AND v.stage NOT IN ('strict', 'reevaluation')",
        )
    }


def test_a_prescribed_clock_is_not_flagged(replay) -> None:
    status, decision, flags, *_ = by_seq(replay)[1]
    assert (status, decision, json.loads(flags)) == ("done", "clean", [])


def test_an_infrastructure_timeout_in_a_strict_rerun_is_retried_not_refused(replay) -> None:
    status, decision, flags, verdict, fitness, error = by_seq(replay)[2]
    assert decision == "unconfirmed" and [f["rule"] for f in json.loads(flags)] == ["clock"]
    assert fitness == pytest.approx(26 * 0.07)  # its first score is stored
    assert "the machine is loaded; not held against the program" in error
    strict = rows(
        replay,
        "SELECT v.status, json_extract(v.artifacts, '$.limit') FROM evaluations v "
        "JOIN candidates c ON c.id = v.candidate WHERE c.seq = 2 AND v.stage = 'strict'",
    )
    assert strict == [("timeout", "wall")]  # the last of its tries is stored
    (reason,) = rows(replay, "SELECT reason FROM audits a JOIN candidates c ON c.id = a.candidate WHERE c.seq = 2")[0]
    assert f"stopped its strict re-evaluation {INFRASTRUCTURE_RETRIES + 1} times" in reason


def test_a_refused_best_keeps_its_first_score_and_prompts_are_told_only_the_decision(
    replay,
) -> None:
    status, decision, _, verdict, fitness, error = by_seq(replay)[3]
    assert (status, decision, verdict) == ("failed", "refused", "rejected")
    assert fitness == pytest.approx(26 * 0.075) and error == "auditor: flagged, then refused"
    (told,) = rows(replay, "SELECT told FROM schedule WHERE seq = 3")[0]
    later = [s for (s,) in rows(replay, "SELECT seq FROM schedule WHERE asked > ?", told)]
    assert later, "no proposal was asked after #3 was refused"
    with sqlite3.connect(f"file:{replay}?mode=ro", uri=True) as conn:
        for seq in later:
            (call,) = conn.execute(
                "SELECT l.id FROM llm_calls l JOIN candidates c ON c.prompt_hash = l.prompt_hash "
                "WHERE c.seq = ? ORDER BY l.id LIMIT 1",
                (seq,),
            ).fetchone()
            prompt = prompt_messages(conn, call)[-1]["content"]
            assert "auditor: flagged, then refused" in prompt
            assert RULES["clock"] not in prompt and "clock at packing.py" not in prompt


def test_no_timeout_feedback_without_its_cause(replay) -> None:
    status, _, _, verdict, fitness, error = by_seq(replay)[4]
    assert (status, verdict, fitness) == ("failed", "timeout", None)
    assert error.startswith("wall limit 10 s reached after ")
    assert "of the 1 CPU seconds: the CPU budget was not reached" in error
    errors = rows(
        replay,
        "SELECT json_extract(artifacts, '$.error') FROM evaluations WHERE status = 'timeout'",
    )
    assert errors and all(
        e.startswith(("wall limit", "CPU budget")) for (e,) in errors
    ), "a timeout's feedback must name the limit hit"
