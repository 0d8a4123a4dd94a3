"""The search loop end to end on the toy fitness: budgets, dedup, failures, resume, determinism."""

import errno
import json
import logging
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evolve import cli
from evolve.launch import config, runner
from evolve.launch.config import new_run_dir
from evolve.settings import ConfigError
from evolve.store import runlock
from evolve.store.database import Store
from evolve.types import CandidateStatus, EvolveError
from tests.conftest import REPO, composed


def sequence(run_dir):
    store = Store(run_dir / "archive.db", readonly=True)
    rows = store.conn.execute("SELECT seq, id, status FROM candidates ORDER BY seq").fetchall()
    store.close()
    return rows


def test_a_short_run_improves_on_the_seed_and_leaves_a_whole_archive(tmp_path):
    cfg = composed(["search.max_candidates=40", "search.workers=2"])
    summary = runner.run(cfg, tmp_path)
    assert summary.evaluated == 40 and summary.best > summary.seed_fitness
    store = Store(tmp_path / "archive.db")
    assert store.integrity_problems() == []
    ids = [row[0] for row in store.conn.execute("SELECT id FROM candidates")]
    assert len(ids) == len(set(ids))
    roles = {row[0] for row in store.conn.execute("SELECT role FROM edges")}
    assert {"mutation", "crossover", "migration"} <= roles
    assert store.conn.execute("SELECT COUNT(*) FROM stats").fetchone()[0] == 40
    assert store.get_state("bandit")["counts"]


def test_a_run_builds_its_fitness_once_from_settings_built_once(tmp_path, monkeypatch):
    built = []
    build = config.build_benchmark
    monkeypatch.setattr(config, "build_benchmark", lambda *a, **k: built.append(a) or build(*a, **k))
    cfg = composed(["search.max_candidates=4", "search.workers=1", "archive.islands=2"])
    settings, resumed = cli.start(cfg, tmp_path, [])
    summary = runner.run(settings, tmp_path, resumed=resumed)
    assert summary.evaluated == 4 and len(built) == 1
    store = Store(tmp_path / "archive.db", readonly=True)
    assert store.get_state("grid")["islands"] == 2
    assert json.loads(store.first_run()["config"]) == settings.config


def test_a_crashing_harness_is_recorded_and_the_run_goes_on(tmp_path):
    cfg = composed(["search.max_candidates=6", "search.workers=1"])
    cfg["benchmark"]["fitness"]["_target_"] = "tests.fixtures.toy.Crashing"
    summary = runner.run(cfg, tmp_path)
    assert summary.evaluated == 6 and summary.failures == 5
    store = Store(tmp_path / "archive.db")
    failed = store.conn.execute(
        "SELECT id FROM candidates WHERE status='failed' LIMIT 1"
    ).fetchone()[0]
    artifacts = store.evaluation(failed).artifacts
    assert "harness bug" in artifacts["error"] and "Traceback" in artifacts["traceback"]


def test_every_evaluation_is_logged_with_its_verdict(tmp_path, caplog):
    cfg = composed(["search.max_candidates=30", "search.workers=1"])
    with caplog.at_level(logging.INFO, logger="evolve"):
        summary = runner.run(cfg, tmp_path / "ok")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("#")]
    store = Store(tmp_path / "ok" / "archive.db", readonly=True)
    for seq, status in store.conn.execute("SELECT seq, status FROM candidates WHERE seq > 0"):
        (line,) = [line for line in lines if line.startswith(f"#{seq} ")]
        assert ("refused before evaluation" in line) == (status == "rejected"), line
    store.close()
    bests = [line for line in lines if "NEW BEST" in line]
    assert bests and f"score = {summary.best:.6g}, " in bests[-1]

    caplog.clear()
    cfg = composed(["search.max_candidates=4", "search.workers=1"])
    cfg["benchmark"]["fitness"]["_target_"] = "tests.fixtures.toy.Crashing"
    with caplog.at_level(logging.INFO, logger="evolve"):
        runner.run(cfg, tmp_path / "crashing")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("#")]
    failed = [line for line in lines if "refused before evaluation" not in line]
    assert len(failed) == 3 and all(": error: RuntimeError: harness bug" in m for m in failed)


def test_an_evaluation_without_a_declared_descriptor_fails_alone_and_the_run_goes_on(tmp_path):
    cfg = composed(["search.max_candidates=5", "search.workers=1"])
    cfg["benchmark"]["fitness"]["_target_"] = "tests.fixtures.toy.MissingDescriptor"
    summary = runner.run(cfg, tmp_path / "children")
    assert summary.evaluated == 5 and summary.failures == 4
    store = Store(tmp_path / "children" / "archive.db", readonly=True)
    assert store.integrity_problems() == []
    errors = [
        store.evaluation(cid).artifacts["error"]
        for (cid,) in store.conn.execute("SELECT id FROM candidates WHERE status='failed'")
    ]
    store.close()
    assert len(errors) == 4 and all(
        "descriptor(s) ['b']" in e and "fix its evaluate()" in e for e in errors
    )

    cfg["benchmark"]["fitness"]["seed_too"] = True
    with pytest.raises(EvolveError, match=r"(?s)fails its own evaluation.*descriptor\(s\) \['b'\]"):
        runner.run(cfg, tmp_path / "seed")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("search.lookahead=-1", "search.lookahead must be 0 or a positive integer"),
        ("search.max_candidates=0", "search.max_candidates must be a positive integer"),
        ("search.max_wall_s=0", "search.max_wall_s must be positive seconds or null"),
        ("search.migration_interval=-5", "search.migration_interval must be 0"),
    ],
)
def test_impossible_search_budgets_are_config_errors(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        runner.run(composed([override]), tmp_path)
    assert not (tmp_path / "archive.db").exists()


def test_a_seed_that_fails_its_own_evaluation_stops_the_run_with_the_reason(tmp_path):
    cfg = composed(["search.max_candidates=5"], fail_seed=True)
    with pytest.raises(EvolveError, match="(?s)fails its own evaluation.*rejects everything"):
        runner.run(cfg, tmp_path)


def test_budget_resume_continues_the_same_sequence(tmp_path):
    full, split = tmp_path / "full", tmp_path / "split"
    runner.run(composed(["search.max_candidates=25", "search.workers=1"]), full)
    runner.run(composed(["search.max_candidates=10", "search.workers=1"]), split)
    assert len([r for r in sequence(split) if r[2] != "rejected"]) == 10
    runner.run(composed(["search.max_candidates=25", "search.workers=1"]), split, resumed=True)
    assert sequence(split) == sequence(full)


def start(run_dir, *extra):
    args = [
        sys.executable,
        "-m",
        "evolve",
        "--config-dir",
        "tests/fixtures/evolve_configs",
        f"hydra.run.dir={run_dir}",
        "benchmark=toy",
        "search.progress=false",
        *extra,
    ]
    if (run_dir / "archive.db").exists():
        args = [a for a in args if not a.startswith("hydra.run.dir")] + [f"resume={run_dir}"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        args,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def evaluated_count(run_dir):
    try:
        store = Store(run_dir / "archive.db", readonly=True)
    except Exception:  # not created yet, or mid-migration
        return 0
    try:
        return store.count(CandidateStatus.DONE) + store.count(CandidateStatus.FAILED)
    except Exception:
        return 0
    finally:
        store.close()


def kill_at_random(run_dir, rng, *extra):
    """Start (or resume) a run and SIGKILL it at a random instant while it evaluates."""
    proc = start(run_dir, *extra)
    target = evaluated_count(run_dir) + rng.randint(1, 12)
    deadline = time.monotonic() + 120
    while evaluated_count(run_dir) < target and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(rng.uniform(0.0, 0.3))
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def finish(run_dir, *extra):
    proc = start(run_dir, *[a for a in extra if a.startswith("search.")])
    output = proc.communicate(timeout=240)[0].decode()
    assert proc.returncode == 0, output


def done_evaluations(run_dir):
    store = Store(run_dir / "archive.db", readonly=True)
    rows = dict(
        store.conn.execute(
            "SELECT c.id, v.id FROM candidates c JOIN evaluations v ON v.candidate = c.id WHERE c.status IN ('done', 'failed')"
        ).fetchall()
    )
    store.close()
    return rows


def test_kill_9_at_random_instants_loses_and_repeats_nothing(tmp_path):
    rng = random.Random(7)
    run_dir = tmp_path / "run"
    budget = ["search.max_candidates=100", "search.workers=2", "benchmark.fitness.sleep_s=0.1"]
    kept, mid_run_kills = {}, 0
    for _ in range(5):
        kill_at_random(run_dir, rng, *budget)
        if not (run_dir / "archive.db").exists():
            continue
        now = done_evaluations(run_dir)
        mid_run_kills += len(now) < 100
        assert all(now.get(cid) == eid for cid, eid in kept.items()), (
            "a completed evaluation was lost or redone"
        )
        kept = now
        store = Store(run_dir / "archive.db")
        assert store.integrity_problems() == []
        store.close()
    finish(run_dir, *budget)
    assert mid_run_kills >= 4
    final = done_evaluations(run_dir)
    assert all(final.get(cid) == eid for cid, eid in kept.items())
    store = Store(run_dir / "archive.db")
    assert store.integrity_problems() == []
    assert store.count(CandidateStatus.DONE) + store.count(CandidateStatus.FAILED) == 100
    assert store.count(CandidateStatus.PROPOSED) == store.count(CandidateStatus.EVALUATING) == 0


def test_kill_9_then_resume_reproduces_the_uninterrupted_sequence(tmp_path):
    budget = ["search.max_candidates=40", "search.workers=1", "benchmark.fitness.sleep_s=0.1"]
    finish(tmp_path / "straight", *budget)
    interrupted = tmp_path / "interrupted"
    rng = random.Random(3)
    for _ in range(2):
        kill_at_random(interrupted, rng, *budget)
    finish(interrupted, *budget)
    assert sequence(interrupted) == sequence(tmp_path / "straight")


def test_one_writer_per_run_directory(tmp_path):
    cfg = composed(["search.max_candidates=3", "search.workers=1"])
    runner.run(cfg, tmp_path)
    with pytest.raises(EvolveError, match="already holds a run .*continue it with resume="):
        runner.run(cfg, tmp_path)  # a new run into a finished run's directory
    busy = pytest.raises(runlock.RunDirectoryBusy, match=f"in use by evolve pid {os.getpid()}")
    with runlock.hold(tmp_path), busy:  # the lock as a running search holds it
        runner.run(composed(["search.max_candidates=6"]), tmp_path, resumed=True)
    summary = runner.run(composed(["search.max_candidates=6"]), tmp_path, resumed=True)
    assert summary.evaluated == 6
    store = Store(tmp_path / "archive.db", readonly=True)
    evaluated = "SELECT COUNT(*) FROM candidates WHERE status IN ('done', 'failed')"
    assert store.integrity_problems() == [] and store.conn.execute(evaluated).fetchone()[0] == 6
    store.close()


def test_runs_started_in_the_same_second_get_their_own_directories(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = Path(new_run_dir(None, "toy"))
    first.mkdir(parents=True)
    second = Path(new_run_dir(None, "toy"))
    assert second != first and second.parent == first.parent
    assert second.name.startswith(first.name[:16])


def test_a_parent_that_an_operator_cannot_read_is_a_rejection_not_a_crash(tmp_path):
    seed = tmp_path / "seed"
    seed.mkdir()
    # blocks unreadable by the tweak operator: a START marker that is never closed
    (seed / "params.py").write_text("# EVOLVE-BLOCK-START\nA = 1.0\nB = 4\nC = 0.5\n")
    cfg = composed(["search.max_candidates=4", "search.workers=1"])
    cfg["benchmark"]["seed"] = str(seed)
    summary = runner.run(cfg, tmp_path / "run")
    assert summary.evaluated == 1 and summary.reason.startswith(
        "50 proposals in a row were rejected"
    )
    store = Store(tmp_path / "run" / "archive.db", readonly=True)
    reasons = [
        store.evaluation(cid).artifacts["error"]
        for (cid,) in store.conn.execute("SELECT id FROM candidates WHERE status='rejected'")
    ]
    store.close()
    assert any("tweak failed on its parents: EditError" in r for r in reasons), reasons


def test_sigterm_stops_a_run_like_ctrl_c_and_leaves_a_summary(tmp_path):
    run_dir = tmp_path / "run"
    budget = ["search.max_candidates=200", "search.workers=1", "benchmark.fitness.sleep_s=0.05"]
    proc = start(run_dir, *budget)
    deadline = time.monotonic() + 120
    while evaluated_count(run_dir) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=120)[0].decode()
    assert proc.returncode == 128 + signal.SIGTERM, output
    assert "SIGTERM: stopped" in output and f"resume={run_dir}" in output
    assert "Traceback" not in output
    store = Store(run_dir / "archive.db", readonly=True)
    assert store.latest_run()["status"] == "stopped" and store.integrity_problems() == []
    store.close()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reason"].startswith("stopped by SIGTERM") and summary["evaluated"] >= 3
    finish(run_dir, "search.max_candidates=12", "search.workers=1")


@pytest.mark.parametrize("where", ["archive", "run lock"])
def test_a_full_disk_ends_in_one_line_naming_the_cause_and_the_resume_command(
    tmp_path, monkeypatch, where
):
    cfg = composed(["search.max_candidates=20", "search.workers=1"])
    if where == "archive":
        written = []

        def add_evaluation(self, *args):
            written.append(args)
            if len(written) > 4:
                raise sqlite3.OperationalError("database or disk is full")
            return original(self, *args)

        original = Store.add_evaluation
        monkeypatch.setattr(Store, "add_evaluation", add_evaluation)
    else:

        def hold(run_dir):
            raise OSError(errno.ENOSPC, "No space left on device", str(run_dir / "evolve.lock"))

        monkeypatch.setattr(runlock, "hold", hold)
    with pytest.raises(SystemExit) as ended:
        cli.report(cfg, tmp_path, [])
    message = str(ended.value.code)
    assert message.startswith(f"error: the disk holding {tmp_path} is full (")
    assert message.endswith(f"continue with: python -m evolve resume={tmp_path}")
    assert "\n" not in message
