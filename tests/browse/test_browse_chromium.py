"""The web page in a real headless Chromium (Debian's chromium driven by playwright).

Needs ``apt-get install -y chromium`` and ``pip install playwright`` (no ``playwright
install``: the system browser is used). Screenshots of each page go to
``test-artifacts/browse/``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from evolve.query.edges import primary_path
from evolve.query.run import best_candidate
from evolve.store.database import Store

CHROMIUM = os.environ.get("EVOLVE_CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).parents[2] / "test-artifacts" / "browse"

playwright_api = pytest.importorskip(
    "playwright.sync_api", reason="pip install playwright (no 'playwright install')"
)
if not Path(CHROMIUM).exists():
    pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install -y chromium", allow_module_level=True)


def start_server(archive: Path) -> tuple[subprocess.Popen, str]:
    """``python -m evolve.browse ARCHIVE serve --port 0 --json``; returns the process and the base URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "evolve.browse", str(archive), "serve", "--port", "0", "--json"],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise RuntimeError("the server did not start")
    return proc, json.loads(line)["url"].rsplit("/-/evolve", 1)[0]


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def browser_context(tmp_path_factory):
    with playwright_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=CHROMIUM,
            headless=True,
            args=FLAGS,
            viewport={"width": 1400, "height": 1000},
        )
        yield context
        context.close()


@pytest.fixture
def page(browser_context):
    """A fresh tab that records console errors and uncaught exceptions in ``page.errors``."""
    tab = browser_context.new_page()
    tab.errors = []
    tab.on("console", lambda message: message.type == "error" and tab.errors.append(message.text))
    tab.on("pageerror", lambda error: tab.errors.append(str(error)))
    yield tab
    tab.close()


@pytest.fixture(scope="module")
def server(run_dir):
    proc, base = start_server(run_dir / "archive.db")
    yield base
    stop(proc)


@pytest.fixture(scope="module")
def facts(run_dir):
    store = Store(run_dir / "archive.db", readonly=True)
    best = best_candidate(store)
    yield {"best": best, "path": primary_path(store, best)}
    store.close()


def shoot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


@pytest.mark.parametrize(
    "name, path",
    [
        ("overview", "/-/evolve"),
        ("elites", "/-/evolve/elites"),
        ("candidate", "/-/evolve/c/best"),
        ("lineage", "/-/evolve/lineage"),
        ("datasette-table", "/archive/candidates?_size=10"),
    ],
)
def test_page_loads_without_console_errors(page, server, name, path):
    response = page.goto(server + path)
    assert response.ok
    page.wait_for_load_state("load")
    assert page.locator("h1").count() >= 1
    shoot(page, name)
    assert page.errors == []


def test_candidate_page_shows_code_and_a_diff(page, server, facts):
    page.goto(f"{server}/-/evolve/c/{facts['best'][:8]}")
    code = page.locator("details.file", has_text="main.py").locator(".highlight")
    assert "EVOLVE-BLOCK-START" in code.inner_text()
    diff = page.locator("details.diff-block .highlight").first
    assert diff.is_visible() and re.search(r"^\+", diff.inner_text(), re.M)
    assert page.locator("#lineage svg a.node").count() >= 2
    assert page.errors == []


def test_clicking_a_lineage_node_opens_that_candidate(page, server, facts):
    page.goto(f"{server}/-/evolve/lineage")
    target = facts["path"][-2]  # the best's parent, on the red path
    node = page.locator(f'svg.lineage a[data-id="{target}"]')
    node.scroll_into_view_if_needed()
    node.locator("circle").click()
    page.wait_for_url(f"**/-/evolve/c/{target}")
    assert target in page.locator("h1").inner_text()
    shoot(page, "lineage-click")
    # and from the candidate page's own graph, back to the best
    page.locator(f'#lineage a[data-id="{facts["best"]}"] circle').click()
    page.wait_for_url(f"**/-/evolve/c/{facts['best']}")
    assert page.errors == []


def test_elites_table_sorts_and_filters(page, server):
    page.goto(f"{server}/-/evolve/elites")
    page.locator("#elites th a.sort", has_text="seq").click()
    page.wait_for_url("**sort=seq**")
    seqs = [int(t) for t in page.locator("#elites tbody tr td:nth-child(4)").all_inner_texts()]
    assert seqs == sorted(seqs, reverse=True)
    page.select_option("select[name=island]", "1")
    page.fill("input[name=cell]", "2,")
    page.locator("#elite-filters button").click()
    page.wait_for_url("**island=1**")
    islands = page.locator("#elites tbody tr td:nth-child(2)").all_inner_texts()
    cells = page.locator("#elites tbody tr td:nth-child(3)").all_inner_texts()
    assert islands and set(islands) == {"1"} and all(c.startswith("2,") for c in cells)
    shoot(page, "elites-filtered")
    assert page.errors == []


def test_the_notebook_page_shows_the_notebook_and_its_versions(page, notes_run):
    proc, base = start_server(notes_run / "archive.db")
    try:
        page.goto(f"{base}/-/evolve")
        page.locator(".evolve-tabs a", has_text="Notebook").click()
        page.wait_for_url("**/-/evolve/notes")
        notebook = page.locator("#notebook")
        assert notebook.locator("h3", has_text="Tried recently").is_visible()
        assert notebook.locator("li").count() >= 3
        shoot(page, "notes")
        page.locator("#notebook-versions summary").click()
        page.locator("#notebook-versions a", has_text="#40").click()
        page.wait_for_url("**at=40")
        assert "an early version" in page.locator("#notebook").inner_text()
        assert page.errors == []
    finally:
        stop(proc)


def test_live_run_updates_the_open_page(page, run_dir, tmp_path, start_writer):
    shutil.copy(run_dir / "archive.db", tmp_path / "archive.db")
    proc, base = start_server(tmp_path / "archive.db")
    try:
        page.goto(f"{base}/-/evolve")
        before = int(page.locator("#candidate-count").inner_text())
        page.evaluate("window.sameDocument = true")
        writer = start_writer(tmp_path / "archive.db", 10)
        written = writer.stdout.read().split()
        assert writer.wait(timeout=60) == 0 and len(written) == 10
        # the page polls every 2 s and swaps its content in place, without a reload
        page.wait_for_function(
            f"Number(document.getElementById('candidate-count').textContent) >= {before + 10}",
            timeout=20_000,
        )
        assert int(page.locator("#candidate-count").inner_text()) == before + 10
        assert page.evaluate("window.sameDocument === true")  # updated in place, not reloaded
        assert (
            page.locator(f'a[href="/-/evolve/c/{written[-1]}"]').count() >= 1
        )  # the new best is linked
        shoot(page, "overview-live")
        assert page.errors == []
    finally:
        stop(proc)
