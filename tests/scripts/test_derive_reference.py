"""scripts/derive_reference.py on the benchmarks' stored GPU results, and its statistics."""

from __future__ import annotations

import importlib.util
import json
import math
import random
import sys
from pathlib import Path

import pytest

from evolve.archive.statistics import one_sided_pvalue

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location(
    "derive_reference", REPO / "scripts/derive_reference.py"
)
derive = sys.modules["derive_reference"] = importlib.util.module_from_spec(
    spec
)  # dataclasses need it
spec.loader.exec_module(derive)


def test_the_speedrun_runs_at_820_steps_are_found_once_each():
    runs = derive.load([REPO / "benchmarks/speedrun/results"], "speedrun", 820)
    first_day = {(r.seed, round(r.value, 4)) for r in runs if r.day == "2026-11-29"}
    assert first_day == {
        (0, 5.0961),
        (1, 5.1150),
        (2, 5.0844),
    }  # merged-target-5.18.json repeats them
    assert all(r.shards == 8 and 240 < r.time_s < 260 for r in runs)
    assert [
        r.value for r in derive.load([REPO / "benchmarks/speedrun/results"], "speedrun", 400)
    ] == [pytest.approx(5.8216, abs=1e-4)]  # the campaign part's run at 400 steps, inside its JSON


def test_nanochat_runs_are_read_from_campaign_parts_and_grouped_by_shards():
    runs = derive.load([REPO / "benchmarks/nanochat/results"], "nanochat", 120)
    assert any(r.shards == 6 and r.day == "2026-12-03" for r in runs)  # inside campaign-scorer.json
    lines = derive.report(derive.load([REPO / "benchmarks/nanochat/results"], "nanochat", 300,
                                      ("warmup-noise",)), "nanochat", 3, 0.01, 0.99)  # fmt: skip
    assert (
        lines[0].startswith("== nanochat on NVIDIA H200, 8 training shards")
        and "1.4014" not in lines[0]
    )


def test_runs_are_kept_apart_by_the_card_they_ran_on_and_each_card_gets_its_own_reference(tmp_path):
    def part(card: str, day: str, values: list[float]) -> dict:
        runs = [{"seed": i, "status": "ok", "val_bpb": v, "metrics": {"steps": 800}} for i, v in enumerate(values)]  # fmt: skip
        return {"date": day, "gpu": f"{card}, 580.1", "runs": [{"results": {"results.json": {
            "summary": {"val_bpb_mean": 0, "budget_s": 300, "device": card, "train_shards": 8},
            "runs": runs}}}]}  # fmt: skip

    (tmp_path / "h100.json").write_text(json.dumps(part("NVIDIA H100 80GB HBM3", "2026-12-07", [1.47, 1.49, 1.48])))  # fmt: skip
    (tmp_path / "h200.json").write_text(json.dumps(part("NVIDIA H200", "2026-12-07", [1.41, 1.42])))
    runs = derive.load([tmp_path], "nanochat", 300)
    assert {r.card for r in runs} == {"NVIDIA H100 80GB HBM3", "NVIDIA H200"}
    lines = derive.report(runs, "nanochat", 3, 0.01, 0.99)
    assert sum(line.startswith("== nanochat on ") for line in lines) == 2
    found = derive.references(runs, 300)
    assert found["NVIDIA H100 80GB HBM3"]["mean"] == pytest.approx(1.48)
    assert found["NVIDIA H100 80GB HBM3"]["runs"] == 3 and found["NVIDIA H200"]["runs"] == 2
    target = tmp_path / "references.json"
    target.write_text(json.dumps({"speedrun_1gpu": {"NVIDIA H200": {"mean": 5.1}}}))
    derive.write_references(target, "nanochat", found)
    stored = json.loads(target.read_text())
    assert set(stored["nanochat"]) == set(found) and stored["speedrun_1gpu"]["NVIDIA H200"]["mean"] == 5.1  # fmt: skip


def test_the_stored_references_are_what_the_stored_runs_give():
    """benchmarks/references.json holds what derive_reference computes from the stored results."""
    stored = json.loads((REPO / "benchmarks/references.json").read_text())
    for benchmark, setting, exclude in (
        ("nanochat", 300, ("warmup-noise",)),
        ("speedrun", 820, ()),
    ):
        runs = derive.load([REPO / f"benchmarks/{benchmark}/results"], benchmark, setting, exclude)
        key = derive.REFERENCE_KEYS[benchmark]
        for card, entry in derive.references(runs, setting).items():
            assert {k: stored[key][card][k] for k in entry} == entry, (benchmark, card)


def test_spreads_split_the_days_from_the_seeds():
    same_days = derive.spreads({"a": [1.0, 1.2], "b": [1.0, 1.2]})
    assert same_days["day_sd"] == 0.0 and same_days["seed_sd"] == pytest.approx(math.sqrt(0.02))
    apart = derive.spreads({"a": [1.0, 1.0 + 1e-6], "b": [2.0, 2.0 + 1e-6]})
    assert apart["day_sd"] == pytest.approx(math.sqrt(0.5), rel=1e-3)


def test_the_target_lets_the_seed_pass_the_fitness_test_with_the_power_asked():
    """The target from the noncentral t, checked against the speedrun fitness's own t-test on
    simulated seeds: passes at probability >= 0.99, and 0.01 lower it would not."""
    mean, sd, n, alpha = 5.08, 0.018, 3, 0.01
    target = derive.target_for(mean, sd, n, alpha, 0.99)
    assert derive.pass_probability((target - mean) / sd, n, alpha) >= 0.99
    assert derive.pass_probability((target - 0.01 - mean) / sd, n, alpha) < 0.99
    rng = random.Random(7)
    for candidate in (target, mean + 4 * sd):
        draws = 4000
        passed = sum(one_sided_pvalue([rng.gauss(mean, sd) for _ in range(n)], candidate) < alpha for _ in range(draws))  # fmt: skip
        expected = derive.pass_probability((candidate - mean) / sd, n, alpha)
        assert (
            abs(passed / draws - expected) < 5 * math.sqrt(expected * (1 - expected) / draws) + 1e-3
        )


def test_the_smallest_gain_grows_as_the_seeds_get_fewer():
    gains = [derive.smallest_gain(1.0, n, 0.01, 0.5) for n in (3, 5, 10)]
    assert gains[0] > gains[1] > gains[2] > 0


def test_the_resampled_target_counts_a_run_far_out_as_often_as_it_came():
    """Nine runs, one of them 0.2 above the rest: every draw of three is counted, so the draws
    holding it (1 - (8/9)^3 = 30% of them) decide the target; the t-test on the other eight
    alone passes a target just above them."""
    bulk = [5.08, 5.09, 5.07, 5.10, 5.08, 5.09, 5.06, 5.09]
    outlier = 5.28
    tight = derive.resampled_target(bulk, 3, 0.01, 0.99)
    assert tight is not None and tight < 5.2
    assert derive.resampled_pass_rate(bulk, tight, 3, 0.01) >= 0.99
    assert derive.resampled_pass_rate(bulk, round(tight - 0.01, 2), 3, 0.01) < 0.99
    with_tail = [*bulk, outlier]
    assert derive.resampled_pass_rate(with_tail, tight, 3, 0.01) < 0.75  # the draws with it fail
    wide = derive.resampled_target(with_tail, 3, 0.01, 0.99)
    assert wide is not None and wide > outlier
    assert derive.resampled_pass_rate(with_tail, wide, 3, 0.01) >= 0.99


def test_the_configured_one_gpu_target_is_the_one_the_stored_runs_give():
    """configs/benchmark/speedrun_1gpu.yaml's target and n_seeds against the runs in
    benchmarks/speedrun/results: at least 5 seeds, and the target the lowest (to 0.01) that its
    n_seeds pass with probability >= 0.99, by the normal model and by resampling the runs."""
    from evolve.benchmarks.speedrun.gpu_run import configured_target
    from omegaconf import OmegaConf

    fitness = OmegaConf.load(REPO / "configs/benchmark/speedrun_1gpu.yaml").fitness
    runs = [r for r in derive.load([REPO / "benchmarks/speedrun/results"], "speedrun", 820) if r.shards == 8]  # fmt: skip
    assert len({r.seed for r in runs}) >= 5 and configured_target() == fitness.target
    s = derive.spreads(derive.per_day(runs, "value"))
    normal = derive.target_for(s["mean"], s["sd"], fitness.n_seeds, fitness.alpha, 0.99)
    values = [r.value for r in runs]
    resampled = derive.resampled_target(values, fitness.n_seeds, fitness.alpha, 0.99)
    assert fitness.target == max(normal, resampled)
