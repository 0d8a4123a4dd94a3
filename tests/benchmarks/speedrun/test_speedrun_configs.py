"""Each speedrun configuration builds a benchmark whose seed, task and harness files exist."""

from __future__ import annotations

import pytest
from evolve.benchmarks.speedrun.fitness import SpeedrunFitness
from hydra import compose, initialize_config_module

from evolve.launch.config import as_dict, build_benchmark


@pytest.mark.parametrize(
    ("name", "target", "gpus"),
    [("speedrun", 3.28, 8), ("speedrun_1gpu", 5.46, 1), ("speedrun_cpu", 5.9, 0)],
)
def test_config_builds(name, target, gpus):
    with initialize_config_module(config_module="evolve.configs", version_base=None):
        cfg = as_dict(compose(config_name="config", overrides=[f"benchmark={name}"]))
    benchmark = build_benchmark(cfg["benchmark"])
    assert isinstance(benchmark.fitness, SpeedrunFitness)
    assert benchmark.fitness.target == target and benchmark.gpus == gpus
    assert benchmark.fitness.settings.nproc_per_node == max(1, gpus)
    seed = benchmark.seed_files()
    assert set(seed) == {"train.py"} and "# EVOLVE-BLOCK-START" in seed["train.py"]
    assert benchmark.is_editable("train.py") and "speedrun_clock" in benchmark.task
    assert (
        all(path.is_file() for path in benchmark.harness_files)
        and len(benchmark.harness_hash()) == 64
    )
    assert benchmark.fitness.objective.name == "train_time_s"
