"""Prompts fit the model's context: cut in the order inspirations, notebook, feedback, parent, task; said in the prompt."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest

from evolve.launch import runner
from evolve.llm import LLMSettings
from evolve.operators.prompting import (
    Budget,
    context_values,
    fitted,
    fitted_text,
    program_view,
    prompt_limit,
    prompt_tokens,
)
from evolve.store.calls import prompt_messages
from evolve.types import EvolveError
from tests.conftest import REPO, composed
from tests.operators.test_mutate import HARNESS, PROGRAM, benchmark, parent

MODEL = "ollama/llama2"  # litellm: a 4096-token window shared by prompt and answer
LIBRARY = HARNESS + "".join(f"def helper_{i}(x):\n    return x + {i}\n" for i in range(120))
FILES = {"main.py": PROGRAM, "harness.py": LIBRARY}
NOTES = "\n".join(f"- lesson {i}: raising STEPS {i} -> {i + 1} changed nothing" for i in range(150))


def values(tmp_path: Path) -> dict:
    bench = benchmark(tmp_path)
    budget = Budget(readonly_chars=len(LIBRARY))
    program = parent(FILES, error="Traceback (most recent call last)\n" + "  frame\n" * 300)
    others = [
        parent(
            {"main.py": PROGRAM.replace("0.05", f"0.0{i}") + "\n".join(["# note"] * 60)},
            1.5,
            cid=str(i) * 20,
        )
        for i in range(6, 9)
    ]
    result = context_values(
        bench, program, others, ["`abc` (diff): bigger -> failed"], budget, NOTES
    )
    result["program"] = program_view(program, bench, budget, label="Program")
    return result


def shown(user: str) -> dict[str, bool]:
    """Which parts of the prompt are whole."""
    return {
        "inspirations": user.count("```diff") == 3,
        "attempts": "## Earlier proposals from this program" in user,
        "notes": NOTES in user,
        "feedback": "  frame\n" * 300 in user,
        "parent": LIBRARY.strip() in user and PROGRAM.strip() in user,
        "task": "maximise the sum of radii" in user,
    }


def test_the_context_comes_from_litellm_or_the_setting() -> None:
    settings = LLMSettings(max_tokens=1000)
    assert prompt_limit(MODEL, settings) == 4096 - 1000  # shared window: the answer's room is kept
    assert prompt_limit("gpt-4o", settings) == 128000  # separate answer limit
    assert prompt_limit("command/anything", settings) is None
    assert (
        prompt_limit("command/anything", LLMSettings(max_tokens=500, context_tokens=3000)) == 2500
    )
    with pytest.raises(EvolveError, match="lower llm.max_tokens or raise llm.context_tokens"):
        prompt_limit(MODEL, LLMSettings(max_tokens=3500))


def test_a_small_context_cuts_in_priority_order_and_says_what(tmp_path) -> None:
    full = fitted("diff.md.j2", values(tmp_path), model=MODEL, limit=None)
    total = prompt_tokens(MODEL, full)
    assert fitted("diff.md.j2", values(tmp_path), model=MODEL, limit=total) == full
    order = ["inspirations", "attempts", "notes", "feedback", "parent", "task"]
    deepest = -1
    for limit in range(total, 0, -150):
        try:
            messages = fitted("diff.md.j2", values(tmp_path), model=MODEL, limit=limit)
        except EvolveError:  # nothing optional is left to cut
            break
        assert prompt_tokens(MODEL, messages) <= limit
        user = messages[1]["content"]
        whole = shown(user)
        cut = [part for part in order if not whole[part]]
        if cut:  # what is cut is always a prefix of the order: nothing before a lower priority
            assert cut == order[: len(cut)], (limit, cut)
            assert "Left out of this prompt to fit the model's context" in user
            deepest = max(deepest, len(cut))
        else:
            assert "Left out" not in user
    assert deepest >= 5, "the limits tried never reached the parent's files"
    assert "the end of harness.py of" in user  # a read-only file of the parent goes first


def test_nothing_left_to_cut_is_an_error_naming_the_fix(tmp_path) -> None:
    with pytest.raises(EvolveError, match="larger context"):
        fitted("diff.md.j2", values(tmp_path), model=MODEL, limit=150)


def test_a_failure_note_keeps_its_runs_of_spaces(tmp_path) -> None:
    note = "`abc` (diff): refused: no line reads '    x = [1,   2]'\n(closest, line 2: '    x = [1,    2]')"
    shown = context_values(benchmark(tmp_path), parent(FILES), [], [note], Budget())["failures"]
    assert shown == [note.replace("\n", " / ")]


@pytest.fixture(scope="module")
def small_context_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("small_context")
    cfg = composed(
        [
            "llm=command",
            "operators.builtin.tweak=0",
            "operators.builtin.crossover=0",
            "search.workers=1",
            "search.max_candidates=12",
            "emitter.selection=weights",
            "archive.islands=1",
            "llm.max_tokens=1000",
            "llm.context_tokens=3800",
        ],
        toy=False,
    )
    command = f"{sys.executable} {REPO / 'tests' / 'fixtures' / 'scripted_model.py'} --seed 0"
    cfg["llm"].update(command=command, operators={"diff": 1.0, "crossover": 1.0})
    runner.run(cfg, run_dir)
    return run_dir


def test_no_call_of_a_small_context_search_exceeds_its_context(small_context_run) -> None:
    db = small_context_run / "archive.db"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        calls = conn.execute("SELECT id, tokens_in FROM llm_calls ORDER BY id").fetchall()
        prompts = [prompt_messages(conn, call)[-1]["content"] for call, _ in calls]  # the user turn
        done = conn.execute("SELECT COUNT(*) FROM candidates WHERE status = 'done'").fetchone()[0]
    assert len(calls) >= 8 and done > 6
    assert max(tokens for _, tokens in calls) <= 3800 - 1000
    cut = [p for p in prompts if "Left out of this prompt to fit" in p]
    assert cut, "the context was never small enough to cut anything"
    notebook_cut = [p for p in cut if "the research notebook's last" in p]
    assert notebook_cut, "no prompt had its notebook cut"
    for prompt in notebook_cut:  # the notebook is cut only once no inspiration is left
        assert "## Other good programs" not in prompt


def test_a_review_or_summary_prompt_cuts_its_long_part_to_fit_the_context() -> None:
    settings = LLMSettings(context_tokens=1500, max_tokens=500)
    diff = "".join(f"+    value_{i} = compute({i}) * {i}\n" for i in range(2000))
    values = {"task": "Keep the rules.", "objective": "score", "direction": "higher is better",
              "diff": diff, "flags": "", "score": "2.5", "best": "2.4", "gain": "+0.1",
              "prescribed": "time.process_time"}  # fmt: skip
    messages = fitted_text("review.md.j2", values, "diff", model="command/x", settings=settings)
    content = messages[-1]["content"]
    assert prompt_tokens("command/x", messages) <= 1000
    assert "characters left out" in content and "Keep the rules." in content
    with pytest.raises(EvolveError, match="raise llm.context_tokens"):
        fitted_text(
            "review.md.j2",
            {**values, "task": "rule " * 3000},
            "diff",
            model="command/x",
            settings=settings,
        )


def test_prompts_show_only_the_metrics_a_benchmark_marks(tmp_path: Path) -> None:
    """Harness timings (``time_full: 0.00022``) are not the model's business."""
    from dataclasses import replace

    from evolve.types import Evaluation

    program = parent(FILES)
    timed = replace(
        program,
        evaluation=Evaluation(
            status=program.evaluation.status,
            fitness=1.3,
            metrics={"valid": 1, "time_full": 0.00022, "time_sandbox_start": 0.1, "cpu_s": 2.0},
        ),
    )
    bench = benchmark(tmp_path)
    unmarked = program_view(timed, bench, Budget(), label="Program")["metrics"]
    assert unmarked == [("cpu_s", "2"), ("valid", 1)]  # every metric but the phase timings
    marked = replace(bench, shown_metrics=("cpu_s",))
    assert program_view(timed, marked, Budget(), label="Program")["metrics"] == [("cpu_s", "2")]
    cp = REPO / "configs" / "benchmark" / "circle_packing.yaml"
    assert "shown_metrics: [min_radius, max_radius, cpu_s, run_s]" in cp.read_text()
