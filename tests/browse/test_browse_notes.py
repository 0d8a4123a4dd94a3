"""The research notebook in browse: ``notes`` on the command line and the ``/-/evolve/notes`` page."""

from __future__ import annotations

import asyncio

from evolve.browse.web.server import make_app


def test_notes_shows_the_latest_notebook(browse, notes_run):
    result = browse("notes", run=notes_run)
    assert result.exit_code == 0, result.output
    for needle in ("Research notebook as shown to proposal #", "The run so far", "Best programs"):
        assert needle in result.output, needle


def test_notes_json_and_an_earlier_version(browse_json, notes_run):
    latest = browse_json("notes", run=notes_run)
    assert latest["seq"] > 40 and "Tried recently" in latest["text"]
    assert [v["seq"] for v in latest["versions"]] == [40, latest["seq"]]
    early = browse_json("notes", "--at", "60", run=notes_run)
    assert early["seq"] == 40 and early["text"].endswith("an early version")


def test_a_run_without_a_notebook_says_so(browse):
    result = browse("notes")
    assert result.exit_code == 0 and "no notebook in this run" in result.output


def test_the_notes_page(notes_run):
    app = make_app(notes_run / "archive.db")
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(app.invoke_startup())
        html = loop.run_until_complete(app.client.get("/-/evolve/notes")).text
        early = loop.run_until_complete(app.client.get("/-/evolve/notes?at=45")).text
    finally:
        loop.close()
    assert '<article class="notebook" id="notebook">' in html and "<h3>Tried recently" in html
    assert 'href="?at=40"' in html and "an early version" in early
