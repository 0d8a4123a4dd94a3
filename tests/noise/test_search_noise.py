"""Noise-aware selection inside a real run: calibration, re-evaluation rows, verdicts, resume."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from evolve.archive.noise import (
    REEVALUATION,
    STATE_KEY,
    Calibration,
    pvalue,
    stored_samples,
)
from evolve.launch import runner
from evolve.settings import ConfigError, NoiseSettings
from evolve.store.database import Store
from tests.conftest import REPO, composed
from tests.fixtures.toy import Toy

NOISY = "tests.noise.noisy_toy.NoisyToy"
SEEDS = 5


def noisy_cfg(budget, *, sigma=4.0, seeds=SEEDS, workers=1, **fitness):
    cfg = composed(  # a fixed grid: assert_promotions_significant replays its cells
        [
            f"search.max_candidates={budget}",
            f"search.workers={workers}",
            f"noise.seeds={seeds}",
            "archive.split_depth=0",
        ]
    )
    cfg["benchmark"]["fitness"].update({"_target_": NOISY, "sigma": sigma, **fitness})
    return cfg


def rows(run_dir):
    store = Store(run_dir / "archive.db", readonly=True)
    out = store.conn.execute(
        "SELECT c.seq, c.id, v.stage, v.status, v.fitness, v.seeds FROM evaluations v "
        "JOIN candidates c ON c.id = v.candidate ORDER BY v.id"
    ).fetchall()
    store.close()
    return out


def test_a_noisy_run_calibrates_reevaluates_and_promotes_only_beyond_noise(tmp_path):
    runner.run(noisy_cfg(40), tmp_path)
    store = Store(tmp_path / "archive.db")
    assert store.integrity_problems() == []
    cal = Calibration.from_json(store.get_state(STATE_KEY))
    assert cal.fitness.n == SEEDS and 1.5 < cal.sigma() < 8  # the toy's noise is 4
    seed_id = cal.seed_id
    seed_rows = store.conn.execute(
        "SELECT stage FROM evaluations WHERE candidate=? ORDER BY id", (seed_id,)
    ).fetchall()
    assert [r[0] for r in seed_rows] == [REEVALUATION] * (SEEDS - 1) + ["full"]
    seed = store.evaluation(seed_id)
    assert seed.metrics["fitness_n"] == SEEDS and len(seed.seeds) == SEEDS
    assert seed.fitness == pytest.approx(cal.fitness.mean)
    # every verdict carries a confidence interval around its mean
    verdicts = store.conn.execute(
        "SELECT candidate FROM evaluations WHERE stage != ? AND status = 'ok'", (REEVALUATION,)
    ).fetchall()
    for (cid,) in verdicts:
        v = store.evaluation(cid)
        assert v.metrics["fitness_ci_low"] <= v.fitness <= v.metrics["fitness_ci_high"]
        assert v.metrics["fitness_n"] == len(v.seeds)
    # some challenger was close and got more seeds; its verdict is the mean of all its samples
    again = store.conn.execute(
        "SELECT candidate, COUNT(*) FROM evaluations WHERE stage = ? AND candidate != ? GROUP BY candidate",
        (REEVALUATION, seed_id),
    ).fetchall()
    assert again, "no challenger was re-evaluated; raise the toy's noise"
    for cid, extra in again:
        v = store.evaluation(cid)
        samples = [
            r[0]
            for r in store.conn.execute(
                "SELECT fitness FROM evaluations WHERE candidate=? AND stage=?", (cid, REEVALUATION)
            )
        ]
        assert v.metrics["fitness_n"] == extra + 1
        assert v.fitness == pytest.approx((v.metrics["score"] + sum(samples)) / (extra + 1))
    # every elite that displaced another did so beyond noise: replay the elite history per cell
    assert_promotions_significant(store, cal, composed()["archive"]["islands"])
    store.close()
    # browse shows each elite's interval and sample count
    shown = subprocess.run(
        [sys.executable, "-m", "evolve.browse", str(tmp_path), "best"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert "CI" in shown.stdout and f"{SEEDS}" in shown.stdout


def assert_promotions_significant(store, cal, islands):
    """Replay the run's verdicts: an elite is displaced only by a challenger better at alpha/looks."""
    settings = NoiseSettings(seeds=SEEDS)
    objective, axes = Toy.objective, Toy.descriptors
    elites = {}
    order = store.conn.execute(
        "SELECT c.id, c.operator, c.island FROM candidates c JOIN evaluations v ON v.candidate = c.id "
        "WHERE v.stage != ? AND v.status = 'ok' ORDER BY v.id",
        (REEVALUATION,),
    ).fetchall()
    refused_better = 0  # challengers with a better mean that plain comparison would have promoted
    for cid, operator, island in order:
        v = store.evaluation(cid)
        cell = ",".join(str(axis.bin(v.descriptors[axis.name])) for axis in axes)
        for key in [(i, cell) for i in range(islands)] if operator == "seed" else [(island, cell)]:
            incumbent = elites.get(key)
            if incumbent is not None:
                p = pvalue(
                    stored_samples(v),
                    stored_samples(incumbent[1]),
                    calibration=cal,
                    incumbent_is_seed=incumbent[0] == cal.seed_id,
                    objective=objective,
                )
                if p >= settings.look_alpha(stored_samples(v).n):
                    refused_better += objective.better(v.fitness, incumbent[1].fitness)
                    continue
            elites[key] = (cid, v)
    assert {(i, cell): cid for i, cell, cid, _ in store.elites()} == {
        k: v[0] for k, v in elites.items()
    }
    assert refused_better >= 1


def test_noise_with_a_deterministic_fitness_promotes_exactly_like_plain_comparison(tmp_path):
    plain, noisy = tmp_path / "plain", tmp_path / "noisy"
    runner.run(noisy_cfg(25, sigma=0.0, seeds=1), plain)
    runner.run(noisy_cfg(25, sigma=0.0, seeds=3), noisy)

    def elites(run_dir):
        store = Store(run_dir / "archive.db", readonly=True)
        out = sorted(store.elites())
        store.close()
        return out

    assert elites(plain) == elites(noisy)
    assert [r[:4] for r in rows(noisy) if r[2] != REEVALUATION] == [r[:4] for r in rows(plain)]


def test_a_budget_resumed_noisy_run_matches_an_uninterrupted_one(tmp_path):
    full, split = tmp_path / "full", tmp_path / "split"
    runner.run(noisy_cfg(20), full)
    runner.run(noisy_cfg(8), split)
    runner.run(noisy_cfg(20), split, resumed=True)
    assert rows(split) == rows(full)


def test_calibration_samples_run_side_by_side_on_the_slots(tmp_path):
    runner.run(noisy_cfg(3, workers=2, sleep_s=0.5), tmp_path)
    store = Store(tmp_path / "archive.db", readonly=True)
    cal = Calibration.from_json(store.get_state(STATE_KEY))
    extra = store.conn.execute(
        "SELECT created_at - wall_s, created_at FROM evaluations WHERE candidate=? AND stage=?",
        (cal.seed_id, REEVALUATION),
    ).fetchall()
    store.close()
    assert cal.fitness.n == SEEDS and len(extra) == SEEDS - 1
    spans = sorted(extra)
    overlaps = sum(later[0] < earlier[1] for earlier, later in zip(spans[:-1], spans[1:], strict=True))
    assert overlaps == (SEEDS - 1) // 2  # waves of two samples, one per slot, one after the other


def test_the_wall_clock_budget_starts_after_the_seeds_calibration(tmp_path):
    cfg = noisy_cfg(20, sleep_s=0.3)  # the calibration alone takes SEEDS x 0.3 s
    cfg["search"]["max_wall_s"] = 0.2
    summary = runner.run(cfg, tmp_path)
    assert summary.reason == "reached search.max_wall_s=0.2" and summary.evaluated >= 2


def test_bad_noise_settings_are_config_errors(tmp_path):
    cfg = noisy_cfg(5)
    cfg["noise"]["alpha"] = 2.0
    with pytest.raises(ConfigError, match="noise.alpha"):
        runner.run(cfg, tmp_path)


def test_kill_9_during_calibration_resumes_without_repeating_stored_samples(tmp_path):
    run_dir, straight = tmp_path / "run", tmp_path / "straight"
    extra = [
        f"benchmark.fitness._target_={NOISY}",
        "+benchmark.fitness.sigma=4.0",
        "benchmark.fitness.sleep_s=0.4",
        "noise.seeds=8",
        "search.max_candidates=3",
        "search.workers=1",
    ]

    def cli(run_dir, resume=False):
        args = [
            sys.executable,
            "-m",
            "evolve",
            "--config-dir",
            "tests/fixtures/evolve_configs",
            "benchmark=toy",
            "search.progress=false",
            *extra,
        ]
        args.append(f"resume={run_dir}" if resume else f"hydra.run.dir={run_dir}")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        return subprocess.Popen(
            args,
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    proc = cli(run_dir)
    deadline = time.monotonic() + 60
    stored = 0
    while time.monotonic() < deadline and stored < 2:
        time.sleep(0.1)
        if (run_dir / "archive.db").exists():
            try:
                store = Store(run_dir / "archive.db", readonly=True)
                stored = store.conn.execute(
                    "SELECT COUNT(*) FROM evaluations WHERE stage=?", (REEVALUATION,)
                ).fetchone()[0]
                store.close()
            except Exception:
                stored = 0
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 2 <= stored < 7, f"calibration was not interrupted midway ({stored} samples stored)"
    for directory, resume in ((run_dir, True), (straight, False)):
        out = cli(directory, resume).communicate(timeout=120)[0].decode()
        assert "Traceback" not in out, out
    assert rows(run_dir) == rows(straight)
    store = Store(run_dir / "archive.db")
    assert store.integrity_problems() == []
    assert json.dumps(store.get_state(STATE_KEY)) == json.dumps(
        Store(straight / "archive.db").get_state(STATE_KEY)
    )


def test_new_cell_entrants_get_the_configured_number_of_seeds(tmp_path):
    cfg = noisy_cfg(12)
    cfg["noise"]["new_cell_seeds"] = 3
    runner.run(cfg, tmp_path)
    store = Store(tmp_path / "archive.db", readonly=True)
    uncontested = [
        store.evaluation(cid)
        for (cid,) in store.conn.execute(
            "SELECT id FROM candidates WHERE status = 'done' AND operator != 'seed'"
        )
    ]
    uncontested = [v for v in uncontested if "fitness_pvalue" not in v.metrics]
    assert uncontested, "no challenger filled an empty cell"
    assert all(v.metrics["fitness_n"] == 3 and len(v.seeds) == 3 for v in uncontested)
    assert store.integrity_problems() == []
    store.close()
