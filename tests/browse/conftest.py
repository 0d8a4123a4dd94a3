"""Fixtures for the browser's tests: a synthetic run written through the real Store API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from evolve.browse.cli import main
from evolve.browse.sample import write_sample_archive


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory) -> Path:
    """A finished run directory with 80 candidates on 2 islands (never written to by the tests)."""
    run = tmp_path_factory.mktemp("run")
    write_sample_archive(run / "archive.db", candidates=80, islands=2, seed=7)
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
