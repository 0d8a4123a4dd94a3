"""Noise measured and used: the notebook reports it from the start, and a lucky score is no new best.

A real run (runner, driver, local backend) of a noisy fitness (the toy's score plus N(0, 1)
drawn from the evaluation seed) driven by the scripted command model. The model may only
change ``D``, a constant the fitness never reads, so every child is exactly as good as the
seed: any "new best" would be noise taken for progress.
"""

from __future__ import annotations

import logging
import sqlite3
import sys

import pytest

from evolve.launch import runner
from evolve.query.notebook import note_at, note_history
from evolve.store.calls import prompt_messages
from tests.conftest import REPO, composed

SEED = "A = 1.0\nB = 4\nC = 0.5\n# EVOLVE-BLOCK-START\nD = 10\n# EVOLVE-BLOCK-END\n"
MODEL = f"{sys.executable} {REPO / 'tests' / 'fixtures' / 'scripted_model.py'} --seed 0"


@pytest.fixture(scope="module")
def noisy_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("noisy")
    (root / "seed").mkdir()
    (root / "seed" / "params.py").write_text(SEED)
    cfg = composed(
        [
            "llm=command",
            f"llm.command={MODEL}",
            "operators.builtin.tweak=0",
            "operators.builtin.crossover=0",
            "search.max_candidates=12",
            "search.workers=1",
            "noise.seeds=4",
        ]
    )
    cfg["benchmark"]["seed"] = str(root / "seed")
    cfg["benchmark"]["fitness"].update(_target_="tests.noise.noisy_toy.NoisyToy", sigma=1.0)
    logger = logging.getLogger("evolve")
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)  # not `.level =`: setLevel clears the loggers' isEnabledFor cache
    try:
        runner.run(cfg, root / "run")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return root / "run" / "archive.db", lines


def test_the_notebook_reports_the_measured_noise_after_the_seeds_evaluations(noisy_run) -> None:
    db, _ = noisy_run
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        (call,) = conn.execute(
            "SELECT l.id FROM llm_calls l JOIN candidates c ON c.prompt_hash = l.prompt_hash "
            "ORDER BY c.seq LIMIT 1"
        ).fetchone()
        first = prompt_messages(conn, call)[-1]["content"]
    assert "0 proposals (none yet); repeated evaluations of one program vary by sd" in first
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        notes = [
            note_at(conn, v["seq"])["text"] for v in note_history(conn) if v["kind"] == "notes"
        ]
    assert notes and all("repeated evaluations of one program vary by sd" in t for t in notes)


def test_no_new_best_within_the_noise(noisy_run) -> None:
    db, lines = noisy_run
    told = [line for line in lines if line.startswith("#")]
    assert len(told) >= 10, lines[-5:]
    assert not [line for line in told if "NEW BEST" in line]
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        (best,) = conn.execute("SELECT c.seq FROM elites e JOIN candidates c ON c.id = e.candidate "
                               "ORDER BY e.objective DESC LIMIT 1").fetchone()
    assert best == 0  # no child of equal worth displaced the seed on luck
