"""``python -m evolve`` as a user meets it: help, custom fitness, bad input, an installed copy."""

import shutil
import sqlite3
import subprocess
import sys

import pytest

from evolve.store import Store
from tests.conftest import REPO, evolve_cli

FAST = ["search.max_candidates=6", "search.progress=false"]


def test_help_lists_the_groups_and_options():
    result = evolve_cli("--help")
    assert result.returncode == 0
    for word in ("benchmark:", "circle_packing", "llm:", "search:", "max_candidates", "resume", "evolve_configs"):
        assert word in result.stdout


def test_default_run_says_it_uses_the_builtin_operators(tmp_path):
    result = evolve_cli(*FAST, f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert "built-in operators" in result.stdout + result.stderr
    assert "run finished" in result.stdout
    assert Store(tmp_path / "archive.db").integrity_problems() == []
    assert (tmp_path / ".hydra" / "config.yaml").exists() and (tmp_path / "evolve.log").exists()


def test_a_fitness_from_a_test_module_runs_with_one_override(tmp_path):
    result = evolve_cli(*FAST, f"hydra.run.dir={tmp_path}", "benchmark.fitness._target_=tests.fixtures.custom_fitness.MinRadius")
    assert result.returncode == 0, result.stderr
    store = Store(tmp_path / "archive.db")
    best = store.conn.execute("SELECT fitness, metrics FROM evaluations WHERE status='ok' ORDER BY fitness DESC").fetchone()
    assert best[0] < 0.2  # a min radius, not a sum of 26 radii


def test_a_benchmark_from_the_users_config_directory_runs_with_one_override(tmp_path):
    shutil.copytree(REPO / "tests" / "fixtures" / "evolve_configs", tmp_path / "evolve_configs")
    result = evolve_cli("benchmark=toy", *FAST, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "archives" / "toy").glob("*/archive.db"))


def test_unknown_benchmark_lists_the_available_ones():
    result = evolve_cli("benchmark=circle_pakcing")
    assert result.returncode != 0
    assert "circle_packing" in result.stderr and "Available options" in result.stderr


def test_a_standard_library_target_is_refused(tmp_path):
    result = evolve_cli(*FAST, f"hydra.run.dir={tmp_path}", "benchmark.fitness._target_=os.system")
    assert result.returncode != 0 and "not allowed" in result.stderr


def test_resume_of_a_missing_directory_names_the_fix(tmp_path):
    result = evolve_cli(f"resume={tmp_path / 'nope'}")
    assert result.returncode != 0 and "no archive.db there" in result.stderr
    assert not (tmp_path / "nope").exists()


@pytest.mark.parametrize("content", [b"garbage" * 500, "foreign"])
def test_corrupt_or_foreign_archive_is_refused_and_left_untouched(tmp_path, content):
    path = tmp_path / "archive.db"
    if content == "foreign":
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE t (x)")
        conn.commit()
        conn.close()
    else:
        path.write_bytes(content)
    before = path.read_bytes()
    result = evolve_cli(f"resume={tmp_path}")
    assert result.returncode != 0
    assert "not an evolve archive" in result.stderr or "not a readable SQLite archive" in result.stderr
    assert path.read_bytes() == before


def test_resume_refuses_a_different_benchmark(tmp_path):
    assert evolve_cli(*FAST, f"hydra.run.dir={tmp_path}").returncode == 0
    result = evolve_cli(f"resume={tmp_path}", "benchmark.fitness.n_circles=10")
    assert result.returncode != 0 and "cannot change" in result.stderr


def test_a_plain_resume_keeps_the_budget_given_at_the_last_resume(tmp_path):
    assert evolve_cli("search.max_candidates=3", "search.progress=false", f"hydra.run.dir={tmp_path}").returncode == 0
    raised = evolve_cli(f"resume={tmp_path}", "search.max_candidates=5", "search.progress=false")
    assert raised.returncode == 0 and "reached search.max_candidates=5" in raised.stdout
    again = evolve_cli(f"resume={tmp_path}", "search.progress=false")
    assert again.returncode == 0 and "reached search.max_candidates=5): 5 evaluated" in again.stdout


def test_a_new_run_in_a_used_directory_is_refused_with_the_resume_command(tmp_path):
    assert evolve_cli(*FAST, f"hydra.run.dir={tmp_path}").returncode == 0
    result = evolve_cli(*FAST, f"hydra.run.dir={tmp_path}", "seed=5")
    assert result.returncode != 0 and f"continue it with resume={tmp_path}" in result.stderr


def test_a_non_editable_install_runs_from_another_directory(tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target), str(REPO)],
        check=True, capture_output=True,
    )
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    env_path = f"{target}"
    check = subprocess.run(
        [sys.executable, "-c", "import evolve; print(evolve.__file__)"],
        cwd=workdir, capture_output=True, text=True, env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
    )
    assert str(target) in check.stdout
    result = subprocess.run(
        [sys.executable, "-m", "evolve", *FAST],
        cwd=workdir, capture_output=True, text=True, env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"}, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert list((workdir / "archives" / "circle_packing").glob("*/archive.db"))


def test_a_benchmarks_search_defaults_apply_unless_overridden():
    from evolve.config import with_benchmark_search_defaults

    cfg = {"benchmark": {"search": {"max_wall_s": 450}}, "search": {"max_wall_s": None, "max_candidates": 300}}
    assert with_benchmark_search_defaults(cfg, [])["search"]["max_wall_s"] == 450
    assert with_benchmark_search_defaults(cfg, ["search.max_wall_s=60"])["search"]["max_wall_s"] is None
