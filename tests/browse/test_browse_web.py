"""The web pages through Datasette's in-process client: content, sorting, filters, errors, live token."""

from __future__ import annotations

import asyncio
import re
import shutil

import pytest

from evolve.browse.web.server import make_app
from evolve.query.run import best_candidate
from evolve.store.database import Store
from evolve.types import CandidateStatus, EdgeRole, EvalStatus, Evaluation, Proposal


@pytest.fixture(scope="module")
def get(run_dir):
    app = make_app(run_dir / "archive.db")
    loop = asyncio.new_event_loop()
    loop.run_until_complete(app.invoke_startup())

    def fetch(path: str):
        return loop.run_until_complete(app.client.get(path))

    yield fetch
    loop.close()


@pytest.fixture(scope="module")
def best(run_dir):
    store = Store(run_dir / "archive.db", readonly=True)
    yield best_candidate(store)
    store.close()


def test_home_redirects_to_the_overview(get):
    response = get("/")
    assert response.status_code == 302 and response.headers["location"] == "/-/evolve"


def test_overview(get, best):
    html = get("/-/evolve").text
    for needle in (
        'id="fitness-chart"',
        'id="quality-chart"',
        'id="cost-chart"',
        'class="heatmap"',
        'class="bars"',
        "Success per operator",
        "Success per model",
        "LLM cost",
        f"/-/evolve/c/{best}",
    ):
        assert needle in html, needle
    assert "cells filled" in get("/-/evolve?island=1").text


def test_elites_sort_and_filter(get):
    html = get("/-/evolve/elites").text
    objectives = [
        float(x) for x in re.findall(r'<td class="num">([-\d.e]+)</td><td>\d+</td>', html)
    ]
    assert len(objectives) > 5 and objectives == sorted(objectives, reverse=True)
    html = get("/-/evolve/elites?sort=seq&order=asc").text
    seqs = [int(x) for x in re.findall(r"<td>[\d,]+</td><td>(\d+)</td>\s*<td>", html)]
    assert len(seqs) > 5 and seqs == sorted(seqs)
    html = get("/-/evolve/elites?island=1&cell=3,").text
    rows = re.findall(r'<td class="num">[-\d.e]+</td><td>(\d+)</td><td>([\d,]+)</td>', html)
    assert rows and all(island == "1" and cell.startswith("3,") for island, cell in rows)


def test_candidate_page(get, best):
    html = get(f"/-/evolve/c/{best[:8]}").text
    assert best in html and 'class="highlight"' in html and "EVOLVE-BLOCK-START" in html
    assert (
        "Diff to each parent" in html and '<span class="gi">+' in html
    )  # pygments marks added lines
    assert 'class="lineage"' in html and 'class="node focus' in html
    assert "sum_radii" in html and "artifact: stdout" in html


def test_lineage_page(get, best):
    html = get("/-/evolve/lineage").text
    assert f'data-id="{best}"' in html and "best-path" in html
    assert "Show inspirations" in html
    assert "edge inspiration" in get(f"/-/evolve/lineage/{best}?inspirations=1").text


def test_unknown_and_ambiguous_ids_are_404_with_the_fix(get):
    response = get("/-/evolve/c/zzzz")
    assert response.status_code == 404 and "no candidate id starts with" in response.text
    assert get("/-/evolve/lineage/zzzz").status_code == 404


def test_datasette_tables_stay_available(get):
    assert get("/archive/candidates?_size=5").status_code == 200
    assert get("/evolve-static/evolve.js").status_code == 200


def test_version_token_moves_when_the_run_writes(run_dir, tmp_path):
    shutil.copy(run_dir / "archive.db", tmp_path / "archive.db")
    app = make_app(tmp_path / "archive.db")
    loop = asyncio.new_event_loop()
    loop.run_until_complete(app.invoke_startup())
    before = loop.run_until_complete(app.client.get("/-/evolve/version.json")).json()["version"]
    writer = Store(tmp_path / "archive.db")
    parent = writer.conn.execute("SELECT candidate FROM elites LIMIT 1").fetchone()[0]
    proposal = Proposal(
        files={"main.py": "x = 'new'\n"}, parents=((parent, EdgeRole.MUTATION),), operator="tweak"
    )
    writer.add_candidate(proposal, seq=writer.next_seq(), status=CandidateStatus.DONE)
    writer.add_evaluation(proposal.id, Evaluation(status=EvalStatus.OK, fitness=99.0))
    writer.put_elite(0, "0,0", proposal.id, 99.0)
    after = loop.run_until_complete(app.client.get("/-/evolve/version.json")).json()["version"]
    assert after != before
    page = loop.run_until_complete(app.client.get("/-/evolve")).text
    assert f"/-/evolve/c/{proposal.id}" in page  # the new best shows without restarting
    writer.close()
    loop.close()


def test_stylesheet_on_every_page_live_script_on_ours_only(get):
    ours, theirs = get("/-/evolve/elites").text, get("/archive/candidates?_size=5").text
    assert "/evolve-static/evolve.css" in ours and "/evolve-static/evolve.css" in theirs
    assert "/evolve-static/evolve.js" in ours and "/evolve-static/evolve.js" not in theirs


@pytest.mark.parametrize(
    "path", ["/-/evolve/candidate/abc", "/-/evolve/nope", "/nope", "/foo/bar", "/archive/no_such_table"]
)
def test_an_unknown_path_is_a_short_404_listing_the_pages(get, path, capfd):
    response = get(path)
    assert response.status_code == 404
    assert f"no page at {path}" in response.text
    for route in ("/-/evolve/elites", "/-/evolve/c/ID", "/-/evolve/lineage", "/-/evolve/notes", "/archive"):
        assert f"<code>{route}</code>" in response.text, route
    assert "Traceback" not in capfd.readouterr().err
    assert get(path + ".json").json()["status"] == 404


def test_serve_answers_a_mistyped_url_with_a_404_and_no_traceback(run_dir):
    import json
    import subprocess
    import sys
    import urllib.error
    import urllib.request

    proc = subprocess.Popen(
        [sys.executable, "-m", "evolve.browse", str(run_dir), "serve", "--port", "0", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = json.loads(proc.stdout.readline())["url"]
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(base + "/candidate/abc", timeout=60)
        assert answer.value.code == 404 and b"/-/evolve/elites" in answer.value.read()
        with urllib.request.urlopen(base, timeout=60) as page:  # the server is still up
            assert page.status == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err and "Error" not in err, err
