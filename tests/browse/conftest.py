"""Fixtures for the browser's tests: a synthetic run written through the real Store API."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from evolve.browse.cli import main
from tests.fixtures.sample_archive import write_sample_archive


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory) -> Path:
    """A finished run directory with 80 candidates on 2 islands (never written to by the tests)."""
    run = tmp_path_factory.mktemp("run")
    write_sample_archive(run / "archive.db", candidates=80, islands=2, seed=7)
    return run


@pytest.fixture(scope="session")
def notes_run(run_dir, tmp_path_factory) -> Path:
    """The sample run with a research notebook built from it (two versions: at #40 and at the end)."""
    from evolve.research.notebook import Notebook
    from evolve.store.database import Store

    run = tmp_path_factory.mktemp("notes_run")
    shutil.copy(run_dir / "archive.db", run / "archive.db")
    store = Store(run / "archive.db")
    last = store.next_seq()
    with store.transaction():
        store.put_note(40, "notes", "### The run so far\n\nan early version")
        Notebook(store).record(store, last)
    store.close()
    return run


@pytest.fixture
def browse(run_dir):
    """Run ``python -m evolve.browse RUN ARGS...`` in-process; returns click's Result."""

    def invoke(*args: str, run: Path | str | None = None) -> Result:
        return CliRunner().invoke(main, [str(run or run_dir), *args], catch_exceptions=False)

    return invoke


@pytest.fixture
def browse_json(browse):
    """Run a command with ``--json`` and return the parsed output."""

    def invoke(*args: str, run: Path | str | None = None):
        result = browse(*args, "--json", run=run)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    return invoke


WRITER = textwrap.dedent("""
    import sys, time
    from evolve.store.database import Store
    from evolve.types import CandidateStatus, EdgeRole, EvalStatus, Evaluation, Proposal
    store = Store(sys.argv[1])
    parent = store.conn.execute("SELECT candidate FROM elites LIMIT 1").fetchone()[0]
    for i in range(int(sys.argv[2])):
        files = {"main.py": f"# live candidate {i}\\nX = {i}\\n"}
        proposal = Proposal(files=files, parents=((parent, EdgeRole.MUTATION),), operator="tweak")
        with store.transaction():
            store.add_candidate(proposal, seq=store.next_seq(), status=CandidateStatus.DONE)
            store.add_evaluation(proposal.id, Evaluation(status=EvalStatus.OK, fitness=100.0 + i))
            store.put_elite(0, "0,0", proposal.id, 100.0 + i)
            store.add_stats(evaluated=store.count(), best=100.0 + i, coverage=0.5, qd_score=1.0, cost=0.0,
                            failures=0)
        print(proposal.id, flush=True)
        time.sleep(0.3)
""")


@pytest.fixture
def start_writer():
    """Start a process that adds ``count`` candidates (each a new best) to an archive, one per 0.3 s;
    it prints each new id. Returns the Popen."""
    procs = []

    def start(archive: Path, count: int) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(archive), str(count)],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
