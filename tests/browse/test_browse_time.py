"""``browse stats`` shows where a real run's evaluation time went, phase by phase, as shares of it."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import evolve
from evolve.archive import noise
from evolve.browse.cli import main
from evolve.query import run as run_queries


def test_stats_shows_the_time_per_phase_of_a_real_run(tmp_path):
    evolve.run(
        ["search.max_candidates=3", "search.progress=false", "search.workers=1"], run_dir=tmp_path
    )
    result = CliRunner().invoke(main, [str(tmp_path), "stats", "--json"], catch_exceptions=False)
    spent = json.loads(result.stdout)["time"]
    shares = {r["phase"]: r["share"] for r in spent["phases"]}
    assert spent["evaluations"] >= 3 and spent["wall_s"] > 0
    assert {"program", "sandbox_start", "sandbox_exit", "verify", "score", "harness"} <= set(shares)
    assert "unmeasured" not in shares  # every second of every evaluation is in a phase
    assert sum(shares.values()) == pytest.approx(1.0, rel=1e-6)
    text = CliRunner().invoke(main, [str(tmp_path), "stats"], catch_exceptions=False).output
    assert "Where the evaluations' time went (circle_packing)" in text and "program" in text


def test_the_breakdown_skips_the_stage_noise_stores_its_samples_under():
    assert run_queries.REEVALUATION == noise.REEVALUATION
