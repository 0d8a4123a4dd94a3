"""The browse command line: every command, its --json form, --help, read-only use and bad input."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from evolve.browse.cli import main
from evolve.query.run import best_candidate
from evolve.store.database import Store

COMMANDS = (
    "best", "show", "diff", "lineage", "cells", "stats", "notes", "export", "plot", "serve", "migrate",
)  # fmt: skip
README = Path(__file__).parents[2] / "evolve" / "browse" / "README.md"


@pytest.fixture(scope="module")
def facts(run_dir):
    store = Store(run_dir / "archive.db", readonly=True)
    conn = store.conn
    best = best_candidate(conn)
    ids = [r[0] for r in conn.execute("SELECT id FROM candidates ORDER BY seq")]
    child = conn.execute(
        "SELECT child, parent FROM edges WHERE role='mutation' ORDER BY rowid LIMIT 1"
    ).fetchone()
    elites = conn.execute("SELECT COUNT(*), MAX(objective) FROM elites").fetchone()
    store.close()
    return {"best": best, "ids": ids, "child": child, "elites": elites}


def test_every_command_is_registered_documented_and_has_help(browse):
    assert set(main.commands) == set(COMMANDS)
    readme = README.read_text()
    for name in COMMANDS:
        result = browse(name, "--help", run="anything")  # --help needs no valid RUN
        assert result.exit_code == 0 and "--json" in result.output, name
        assert f"`{name}" in readme, f"{name} missing from {README}"


def test_summary_without_a_command(browse, facts):
    result = browse()
    assert (
        result.exit_code == 0
        and facts["best"][:12] in result.output
        and "Best 5 elites" in result.output
    )


def test_best(browse, browse_json, facts):
    rows = browse_json("best", "-k", "4")
    assert (
        len(rows) == 4
        and rows[0]["id"] == facts["best"]
        and rows[0]["objective"] == facts["elites"][1]
    )
    assert [r["objective"] for r in rows] == sorted((r["objective"] for r in rows), reverse=True)
    assert {"island", "cell", "operator", "model", "seq", "metrics"} <= set(rows[0])
    assert all(r["island"] == 1 for r in browse_json("best", "--island", "1", "-k", "50"))
    assert all(r["cell"].startswith("3,") for r in browse_json("best", "--cell", "3,", "-k", "50"))
    text = browse("best", "-k", "3").output
    assert "Best 3 elites" in text and facts["best"][:12] in text and "sum_radii" in text
    every = browse_json("best", "-k", "500")
    assert None not in {r["model"] for r in every} and "builtin" in {r["model"] for r in every}
    seed = browse_json("show", "#0")
    assert seed["model"] == "builtin"  # what the tables print for a built-in operator


def test_show(browse, browse_json, facts):
    item = browse_json("show", facts["best"][:8])
    assert item["id"] == facts["best"] and item["status"] == "done" and "main.py" in item["files"]
    assert item["evaluations"][0]["metrics"]["sum_radii"] == item["fitness"]
    assert item["cells"] and item["parents"]
    text = browse("show", facts["best"][:8]).output
    assert "EVOLVE-BLOCK-START" in text and "sum_radii" in text and facts["best"] in text
    llm = next(i for i in facts["ids"] if browse_json("show", i)["llm_calls"])
    text = browse("show", llm).output
    assert "prompt" in text and "answer" in text and "SEARCH" in text
    failed = [i for i in facts["ids"] if browse_json("show", i)["status"] == "failed"][0]
    assert "overlap" in browse("show", failed).output  # the artifact that says why


def test_show_by_seq_and_best(browse_json, facts):
    assert browse_json("show", "#0")["id"] == facts["ids"][0]
    assert browse_json("show", "best")["id"] == facts["best"]


def test_diff_defaults_to_the_parent(browse, browse_json, facts):
    child, parent = facts["child"]
    data = browse_json("diff", child)
    assert data["from"] == parent and data["to"] == child
    assert data["diff"].startswith(f"--- {parent[:10]}/main.py") and "\n+" in data["diff"]
    assert browse("diff", child).output.startswith(f"--- {parent[:10]}/main.py")
    same = browse_json("diff", child, child)
    assert same["diff"] == ""
    back = browse_json("diff", child, parent)
    assert back["from"] == child and back["to"] == parent


def test_lineage_formats(browse, browse_json, facts):
    data = browse_json("lineage", facts["best"])
    path = data["path"]
    assert path[-1]["id"] == facts["best"] and path[0]["generation"] == data["shown_from"]
    assert data["generations"] >= len(path) >= 2
    text = browse("lineage", facts["best"]).output
    assert f"Lineage of {facts['best'][:12]}" in text and "gen" in text
    dot = browse("lineage", facts["best"], "--format", "dot").output
    assert dot.startswith("digraph lineage {") and facts["best"] in dot
    graph = json.loads(browse("lineage", facts["best"], "--format", "json").output)
    assert graph["best"] == facts["best"] and graph["path_to_best"][-1] == facts["best"]
    assert {n["id"] for n in graph["nodes"]} >= set(graph["path_to_best"])


def test_cells(browse, browse_json, facts):
    view = browse_json("cells")
    assert view["shape"] == [8, 8] and view["axes"] == ["spread", "symmetry"]
    assert view["filled"] == sum(v is not None for row in view["values"] for v in row) > 0
    assert max(v for row in view["values"] for v in row if v is not None) == facts["elites"][1]
    assert browse_json("cells", "--island", "0")["island"] == 0
    assert "cells filled" in browse("cells").output


def test_stats(browse, browse_json, facts):
    data = browse_json("stats")
    assert sum(v for k, v in data["counts"].items() if not k.startswith("eval_")) == len(
        facts["ids"]
    )
    success = data["success"]
    operators = {r["operator"]: r for r in success["operator"]}
    assert {"tweak", "crossover", "diff", "rewrite", "seed"} <= set(operators)
    assert (
        sum(r["candidates"] for r in success["model"]) == len(facts["ids"]) == success["candidates"]
    )
    assert all(0 <= r["ok_rate"] <= 1 and r["improved"] <= r["ok"] for r in success["operator"])
    assert sum(r["elites"] for r in success["operator"]) == facts["elites"][0]
    recent = browse_json("stats", "--last", "10")["success"]
    assert recent["candidates"] == 10 and recent["window"] == len(facts["ids"]) - 10
    assert data["cost"]["calls"] > 0 and data["cost"]["cost"] == pytest.approx(
        0.004 * data["cost"]["calls"]
    )
    assert data["series"][-1]["evaluated"] > data["series"][0]["evaluated"]
    text = browse("stats").output
    assert "Success per operator" in text and "Success per model" in text and "LLM cost" in text


def test_export(browse, browse_json, facts, tmp_path):
    out = tmp_path / "exported"
    data = browse_json("export", facts["best"], str(out))
    assert sorted(Path(p).name for p in data["files"]) == ["helpers.py", "main.py"]
    assert "EVOLVE-BLOCK-START" in (out / "main.py").read_text()
    again = browse("export", facts["best"], str(out))
    assert again.exit_code != 0 and "--force" in again.stderr
    assert browse("export", facts["best"], str(out), "--force", "--with-meta").exit_code == 0
    assert json.loads((out / "candidate.json").read_text())["id"] == facts["best"]


def test_plot(browse_json, tmp_path):
    paths = browse_json("plot", "--out", str(tmp_path / "p"))
    assert sorted(Path(p).name for p in paths) == ["fitness.png", "grid.png", "success.png"]
    assert all(Path(p).stat().st_size > 5000 for p in paths)


def test_commands_never_write_to_the_archive(run_dir, browse, facts, tmp_path):
    digest = hashlib.sha256((run_dir / "archive.db").read_bytes()).hexdigest()
    for args in (
        ("best",),
        ("show", "best"),
        ("diff", "best"),
        ("lineage", "best"),
        ("cells",),
        ("stats",),
        ("export", "best", str(tmp_path / "x")),
    ):
        assert browse(*args).exit_code == 0, args
    assert hashlib.sha256((run_dir / "archive.db").read_bytes()).hexdigest() == digest


# --- bad input: one line, naming the fix -------------------------------------------------------


def _one_line_error(result) -> str:
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr  # as the run says it
    return lines[0]


def test_path_that_is_not_an_archive(browse, tmp_path):
    text_file = tmp_path / "notes.txt"
    text_file.write_text("hello, this is not a database " * 100)
    assert "not a readable SQLite archive" in _one_line_error(browse("best", run=text_file))
    assert "has no archive.db" in _one_line_error(browse("best", run=tmp_path))
    assert "does not exist" in _one_line_error(browse("stats", run=tmp_path / "missing"))
    foreign = tmp_path / "foreign.db"
    sqlite3.connect(foreign).execute("CREATE TABLE people (name TEXT)").connection.commit()
    assert "not an evolve archive" in _one_line_error(browse("cells", run=foreign))


def test_unknown_and_ambiguous_ids(browse, facts):
    line = _one_line_error(browse("show", "zzzz"))
    assert "no candidate id starts with 'zzzz'" in line and "best" in line
    by_first = {}
    for cid in facts["ids"]:
        by_first.setdefault(cid[0], []).append(cid)
    prefix = next(p for p, ids in by_first.items() if len(ids) > 1)
    line = _one_line_error(browse("diff", prefix))
    assert "ambiguous" in line and "type more characters" in line
    assert "seqs run from #0" in _one_line_error(browse("show", "#99999"))


def test_diff_of_a_seed_asks_for_a_second_id(browse, facts):
    assert "give a second ID" in _one_line_error(browse("diff", "#0"))


def test_browse_imports_no_llm_sandbox_search_or_fitness():
    code = (
        "import sys, evolve.browse.cli, evolve.browse.web.server, evolve.browse.web.views, evolve.research.plots, "
        "evolve.research.lineage\n"
        "bad = [m for m in ('evolve.llm', 'evolve.sandbox.process', 'evolve.search.driver', 'evolve.search.engine', 'evolve.harness.fitness', 'litellm', 'torch') "
        "if m in sys.modules]\n"
        "print(bad)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_module_entry_point(run_dir):
    result = subprocess.run(
        [sys.executable, "-m", "evolve.browse", str(run_dir), "best", "-k", "1", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert len(json.loads(result.stdout)) == 1


def test_an_archive_of_an_older_evolve_is_refused_with_the_command_that_upgrades_it(
    browse, browse_json, tmp_path
):
    import sqlite_utils

    from evolve.store.schema import APPLICATION_ID, MIGRATIONS

    old = tmp_path / "archive.db"
    with sqlite3.connect(old, isolation_level=None) as conn:  # as an evolve of schema 6 left it
        for migration in MIGRATIONS[:6]:
            migration(sqlite_utils.Database(conn))
        conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
        conn.execute("PRAGMA user_version=6")
    refused = browse("stats", run=old)
    assert refused.exit_code != 0 and f"python -m evolve.browse {old} migrate" in refused.output
    assert browse_json("migrate", run=old) == {
        "archive": str(old),
        "migrated": True,
        "backup": str(tmp_path / "archive.db.schema6.bak"),
    }
    with sqlite3.connect(tmp_path / "archive.db.schema6.bak") as kept:
        assert kept.execute("PRAGMA user_version").fetchone()[0] == 6  # the file as it was
    assert browse("stats", run=old).exit_code == 0
    again = browse("migrate", run=old)
    assert again.exit_code == 0 and "nothing to do" in again.output

