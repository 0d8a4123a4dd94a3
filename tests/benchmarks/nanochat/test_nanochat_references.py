"""The seed's references for the quick stages are measured once and read by every later worker process."""

from __future__ import annotations

import json
from pathlib import Path

from evolve.benchmarks.nanochat import scales

from evolve.harness.fitness import EvalContext
from tests.fixtures.nanochat_tiny import tiny_fitness

SEED = scales.SCALES["cpu"].seed_dir
STEPS = 4  # a short run of its own: its stored band is this test's alone


def test_a_fresh_worker_reads_the_stored_loss_band_instead_of_measuring_again(data_dir, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    for path in SEED.glob("*.py"):
        (work / path.name).write_text(path.read_text())
    layered = {"local_check": False, "short_run_steps": STEPS}
    first = tiny_fitness(data_dir, layered=layered)
    ctx = EvalContext(seed=0, scratch=tmp_path)
    assert first.stages[0].name == "short_run"
    bands = Path(first.calibration_dir)
    before = set(bands.glob("short-run-*.json"))  # other tests' bands (other steps) may be there
    assert first.stages[0].run(work, ctx).ok
    [band] = set(bands.glob("short-run-*.json")) - before
    measured = json.loads(band.read_text())
    assert len(measured["mean"]) == 1 and measured["sd"][0] > 0  # three seeds of the seed program
    # a fresh fitness (another worker process) must take the band from the store: a marked band
    # there shows through in its verdict, where measuring again would not
    band.write_text(json.dumps({**measured, "mean": [100.0], "sd": [0.0]}))
    try:
        second = tiny_fitness(data_dir, layered=layered)
        verdict = second.stages[0].run(work, ctx)
        assert verdict.ok and verdict.metrics["short_run_band_upper"] == 105.0  # 100 + 5% slack
    finally:
        band.unlink()
    assert str(first.calibration_dir) in first.forbidden()  # candidates never see the references


def test_the_harness_warms_the_compile_cache_once_with_the_seed_and_candidates_only_read_it(
    data_dir, tmp_path
):
    cache = tmp_path / "compile-cache"
    first = tiny_fitness(data_dir, compile_cache=str(cache))
    assert [s.name for s in first.stages] == ["cache_warmup", "full"]
    assert str(cache) in first._policy([], warming=True).writable  # the harness's seed run writes
    candidate = first._policy([])
    assert str(cache) in candidate.shared_caches and str(cache) not in candidate.writable
    ctx = EvalContext(seed=0, scratch=tmp_path)
    assert first.stages[0].run(tmp_path, ctx).metrics == {"cache_warmup_ok": 1}
    [record] = cache.glob("warmed-*.json")
    assert json.loads(record.read_text())["status"] == "ok"
    # a fresh fitness (another worker) reads the record instead of warming again
    record.write_text(json.dumps({"status": "marked"}))
    second = tiny_fitness(data_dir, compile_cache=str(cache))
    assert second.stages[0].run(tmp_path, ctx).metrics == {"cache_warmup_ok": 0}
