"""The research notebook: its pieces, and a lesson crossing islands in a real circle-packing search
that survives kill -9 and replays offline exactly."""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from evolve.archive.grid import describe_cell
from evolve.launch import runner
from evolve.query.notebook import note_at, note_history
from evolve.research.notebook import Notebook, cause, change_label
from evolve.store.calls import prompt_messages
from evolve.store.database import Store
from evolve.types import CandidateStatus, EdgeRole, EvalStatus, Evaluation, Proposal
from tests.conftest import REPO, composed, evolve_cli, start_evolve
from tests.fixtures.sample_archive import write_sample_archive

LESSON_MODEL = (
    f"{sys.executable} {REPO / 'tests' / 'fixtures' / 'lesson_model.py'} --mistakes 3 --seed 0"
)
MISTAKE = "the SEARCH text was not found"
ISLANDS = 2
SUMMARY_EVERY = 5


def rows(db: Path, sql: str, *args) -> list[tuple]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return conn.execute(sql, args).fetchall()


def notebook_rows(db: Path) -> list[tuple]:
    """Every notebook row as (seq, kind, text), its packed text read back."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return [
            (v["seq"], v["kind"], note_at(conn, v["seq"], v["kind"])["text"])
            for v in note_history(conn)
        ]


def prompt_of(db: Path, seq: int) -> str:
    """The user message the model was sent for proposal ``seq``."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        (call,) = conn.execute(
            "SELECT l.id FROM llm_calls l JOIN candidates c ON c.prompt_hash = l.prompt_hash "
            "WHERE c.seq = ? ORDER BY l.id LIMIT 1",
            (seq,),
        ).fetchone()
        return prompt_messages(conn, call)[1]["content"]


def lesson_search(extra: list[str] = ()) -> dict:
    cfg = composed(
        [
            "llm=command",
            "operators.builtin.tweak=0",
            "operators.builtin.crossover=0",
            "search.workers=1",
            "search.max_candidates=14",
            "emitter.selection=weights",
            f"archive.islands={ISLANDS}",
            f"llm.notebook_summary_every={SUMMARY_EVERY}",
            *extra,
        ],
        toy=False,
    )
    cfg["llm"].update(
        command=LESSON_MODEL, operators={"diff": 2.0, "rewrite": 1.0, "crossover": 1.0}
    )
    return cfg


# --- pieces -----------------------------------------------------------------------------------


def test_a_cell_is_shown_with_its_axes_named() -> None:
    axes = [
        {"name": "radius_std", "low": 0.0, "high": 0.06, "bins": 6},
        {"name": "wall_fraction", "low": 0.0, "high": 1.0, "bins": 6},
    ]
    assert describe_cell("1,3", axes) == "radius_std 0.01-0.02, wall_fraction 0.5-0.6667"
    # a split cell is named the same way: its ranges, each level halving the bin
    assert describe_cell("1,3/0,1", axes) == "radius_std 0.01-0.015, wall_fraction 0.5833-0.6667"
    assert describe_cell("c17", axes) == "c17 (radius_std x wall_fraction)"
    assert describe_cell("0", None) == "0" and describe_cell(None, axes) == ""


def test_a_change_of_settings_is_named_by_what_it_sets() -> None:
    before = {"main.py": "A = 1\nB = [1, 2]  # rows\ndef f():\n    return A\n"}
    assert change_label(before, {"main.py": before["main.py"].replace("A = 1", "A = 8")}) == (
        "A",
        "A 1 -> 8",
    )
    assert change_label(
        before, {"main.py": before["main.py"].replace("return A", "return -A")}
    ) == ("edits f()", "edits f() (-1/+1 lines)")  # the diff's gist, not the model's prose
    grown = before["main.py"] + "class G:\n    def h(self):\n        return 1\n"
    assert change_label(before, {"main.py": grown})[0] == "edits class G, G.h()"
    assert change_label(before, {"main.py": "def (:\n"}) == ("", "-4/+1 lines")


def test_failures_group_by_cause_without_their_particulars() -> None:
    one = "1 of 2 SEARCH/REPLACE blocks did not apply: block 1 (a.py): the SEARCH text was not found; no line reads 'x = 3'"
    two = "1 of 1 SEARCH/REPLACE blocks did not apply: block 1 (a.py): the SEARCH text was not found; no line reads 'y'"
    assert cause(one) == cause(two)
    trace = 'Traceback (most recent call last):\n  File "a.py", line 3\nValueError: bad radius 0.31'
    assert cause(trace) == "ValueError: bad radius N"


def test_a_proposal_told_late_still_reaches_the_notebook(tmp_path) -> None:
    store = Store(write_sample_archive(tmp_path / "archive.db", candidates=30, seed=3))
    notebook = Notebook(store)
    notebook.text()
    parent = store.seed_candidate().id
    first = store.next_seq()

    def add(seq: int, evaluation: Evaluation) -> None:
        files = {"main.py": f"X = {seq}\n"}
        proposal = Proposal(files=files, parents=((parent, EdgeRole.MUTATION),), operator="tweak")
        status = CandidateStatus.DONE if evaluation.ok else CandidateStatus.FAILED
        with store.transaction():
            store.add_candidate(proposal, seq=seq, status=status)
            store.add_evaluation(proposal.id, evaluation)

    add(first + 1, Evaluation(status=EvalStatus.OK, fitness=0.5))  # #first is still in flight
    notebook.text()
    add(first, Evaluation(status=EvalStatus.ERROR, artifacts={"error": "ValueError: late 3"}))
    text = notebook.text()
    assert "failed: ValueError: late N" in text and text == Notebook(store).text()


def test_effects_are_judged_against_the_measured_noise(tmp_path) -> None:
    store = Store(write_sample_archive(tmp_path / "archive.db", candidates=30, seed=4))
    assert "noise not measured" in Notebook(store).text()
    seed = store.seed_candidate().id
    with store.transaction():
        for fitness in (0.0, 2.0):  # the seed's re-evaluations: with its verdict, sd about 1
            store.add_evaluation(
                seed, Evaluation(status=EvalStatus.OK, fitness=fitness, stage="reevaluation")
            )
    text = Notebook(store).text()
    assert "repeated evaluations of one program vary by sd 1, so an effect holds only beyond 2" in text
    effects = text.split("### Effects that hold (beyond noise; newest first)\n\n", 1)[1]
    assert effects.startswith("- 5 other change(s) moved the score by no more than the noise")
    assert "a single try is a single try" in text


# --- the notebook in a real search ---------------------------------------------------------------


@pytest.fixture(scope="module")
def lesson_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("lesson_run")
    runner.run(lesson_search(), run_dir)
    return run_dir


def test_a_lesson_from_one_island_reaches_a_later_prompt_on_another(lesson_run) -> None:
    db = lesson_run / "archive.db"
    ((island, status, reason),) = rows(
        db,
        "SELECT c.island, c.status, json_extract(v.artifacts, '$.error') FROM candidates c "
        "JOIN evaluations v ON v.candidate = c.id WHERE c.seq = 3",
    )
    assert status == "rejected" and MISTAKE in reason and island == 3 % ISLANDS
    # an effect measured on island 1, and the failure cause, in a later prompt on island 0
    later = [
        seq
        for (seq,) in rows(
            db,
            "SELECT seq FROM candidates WHERE seq > 4 AND island != ? AND prompt_hash IS NOT NULL "
            "ORDER BY seq",
            island,
        )
    ]
    assert later, "no later LLM proposal on the other island"
    prompt = prompt_of(db, later[-1])
    notebook = prompt.split("## Research notebook", 1)[1].split("\n## ", 1)[0]
    failures = notebook.split("### Failures by cause", 1)[1].split("###", 1)[0]
    effects = notebook.split("### Effects that hold", 1)[1].split("###", 1)[0]
    assert (
        f"refused: N of N SEARCH/REPLACE blocks did not apply: block N (packing.py): {MISTAKE}"
        in failures
    )
    assert f", island {island}, #" in effects
    # the engine's own refusals (a crossover with one elite) are not the model's lessons
    assert "crossover needs two different parents" not in prompt


def test_a_model_summarises_the_notebook_through_the_recorded_client(lesson_run) -> None:
    db = lesson_run / "archive.db"
    summaries = rows(
        db, "SELECT seq, model, prompt_hash, text FROM notebook WHERE kind = 'summary' ORDER BY seq"
    )
    proposals = rows(db, "SELECT MAX(seq) FROM candidates")[0][0]  # refusals take seqs too
    assert [seq for seq, *_ in summaries] == list(range(SUMMARY_EVERY, proposals + 1, SUMMARY_EVERY))
    for seq, model, prompt_hash, text in summaries:
        assert model == "command/lesson_model" and text.startswith("- Lesson: ")
        calls = rows(
            db,
            "SELECT tokens_in, response IS NOT NULL FROM llm_calls WHERE prompt_hash = ?",
            prompt_hash,
        )
        assert len(calls) == 1 and calls[0][0] > 0 and calls[0][1], seq  # recorded, counted
    later = rows(db, "SELECT MAX(seq) FROM candidates WHERE prompt_hash IS NOT NULL")[0][0]
    seq, _, _, text = [summary for summary in summaries if summary[0] < later][-1]
    assert (
        f"### Lessons summarised by command/lesson_model at proposal {seq}\n\n{text}"
        in prompt_of(db, later)
    )


def test_an_offline_replay_shows_the_same_notebook(lesson_run, tmp_path) -> None:
    cfg = lesson_search()
    cfg["llm"].update(
        model="command/lesson_model", command="false", offline=True, replay_from=str(lesson_run)
    )
    runner.run(cfg, tmp_path)
    original = notebook_rows(lesson_run / "archive.db")
    assert len(original) > 5
    assert notebook_rows(tmp_path / "archive.db") == original
    calls = "SELECT COUNT(*), COALESCE(SUM(error IS NOT NULL), 0) FROM llm_calls"
    assert rows(tmp_path / "archive.db", calls)[0][1] == 0


def test_the_notebook_survives_kill_9_and_resume(tmp_path) -> None:
    run_dir = tmp_path / "run"
    db = run_dir / "archive.db"
    args = [
        sys.executable,
        "-m",
        "evolve",
        "search.progress=false",
        "llm=command",
        f"llm.command={LESSON_MODEL}",
        "operators.builtin.tweak=0",
        "operators.builtin.crossover=0",
        "search.workers=1",
        "search.max_candidates=16",
        f"archive.islands={ISLANDS}",
        f"llm.notebook_summary_every={SUMMARY_EVERY}",
    ]
    proc = start_evolve(args, run_dir)
    try:
        while proc.poll() is None and not (db.exists() and _notes(db) >= 6):
            time.sleep(0.2)  # polls a condition: no timing margin
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = notebook_rows(db)
    assert len(before) >= 6, "the run ended before the notebook had 6 versions"
    resumed = evolve_cli("search.progress=false", f"resume={run_dir}", timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = notebook_rows(db)
    assert after[: len(before)] == before and len(after) > len(before)
    assert Store(db, readonly=True).integrity_problems() == []
    # the last prompt carries the notebook stored for its proposal
    (asked,) = rows(db, "SELECT MAX(seq) FROM candidates WHERE prompt_hash IS NOT NULL")[0]
    shown = [text for seq, kind, text in notebook_rows(db) if kind == "notes" and seq <= asked][-1]
    assert shown.strip() in prompt_of(db, asked)


def _notes(db: Path) -> int:
    try:
        return rows(db, "SELECT COUNT(*) FROM notebook")[0][0]
    except sqlite3.OperationalError:  # the table is not made yet
        return 0
