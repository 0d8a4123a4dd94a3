"""Diversity that survives convergence (issue 17): real 100-candidate circle-packing runs keep many cells per island.

Built-in operators, and the scripted command client (a real edit of the prompt's program per
call); one evaluation slot, so each run is the same every time. Slow: minutes on 2 cores.
"""

from __future__ import annotations

import sqlite3
import sys

import pytest

from evolve.launch import runner
from tests.conftest import REPO, composed

SCRIPTED = f"{sys.executable} {REPO / 'tests' / 'fixtures' / 'scripted_model.py'} --seed 0"
LACK_OF_PARENTS = ("both parents are the same candidate", "needs two different parents")


@pytest.mark.slow
@pytest.mark.parametrize(
    "client", [[], ["llm=command", f"llm.command={SCRIPTED}"]], ids=["builtin", "scripted"]
)
def test_a_100_candidate_run_ends_with_ten_cells_per_island_and_crossover_always_has_parents(
    tmp_path, client
):
    cfg = composed([*client, "search.max_candidates=100", "search.workers=1"], toy=False)
    runner.run(cfg, tmp_path)
    db = sqlite3.connect(tmp_path / "archive.db")
    cells = dict(db.execute("SELECT island, COUNT(*) FROM elites GROUP BY island"))
    assert len(cells) == 2 and min(cells.values()) >= 10, cells
    refused = db.execute(
        "SELECT c.seq, json_extract(e.artifacts, '$.error') FROM candidates c "
        "JOIN evaluations e ON e.candidate = c.id WHERE c.status = 'rejected' AND c.seq > 20"
    ).fetchall()
    assert not [r for r in refused if any(text in (r[1] or "") for text in LACK_OF_PARENTS)]
