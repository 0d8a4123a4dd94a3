"""The harness end to end on CPU: an honest candidate passes; each way of cheating is caught.

Every candidate is a real training program (the seed, or the seed edited the way a
cheating candidate would be) run through the sandbox, the clock and the evaluator.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from evolve.benchmarks.speedrun.data import ensure_stdlib_shards
from evolve.benchmarks.speedrun.fitness import SpeedrunFitness

from evolve.harness.fitness import EvalContext, evaluate_safely
from evolve.types import EvalStatus
from tests.fixtures.speedrun_cpu import cpu_fitness

SEED = Path(__file__).resolve().parents[3] / "benchmarks" / "speedrun" / "seed" / "train.py"
QUICK = {"steps": 20, "warmup_steps": 2}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    return str(ensure_stdlib_shards(tmp_path_factory.mktemp("speedrun-data") / "stdlib"))


def fitness(data_dir: str, **kwargs) -> SpeedrunFitness:
    return cpu_fitness(data_dir, **kwargs)


def candidate(tmp_path: Path, *edits: tuple[str, str]) -> Path:
    """The seed program with ``(old, new)`` text replacements applied (each must match)."""
    text = SEED.read_text()
    for old, new in edits:
        assert old in text, f"the seed no longer contains {old!r}"
        text = text.replace(old, new)
    folder = tmp_path / "candidate"
    folder.mkdir()
    (folder / "train.py").write_text(text)
    return folder


def evaluate(f: SpeedrunFitness, folder: Path, tmp_path: Path):
    return evaluate_safely(f, folder, EvalContext(seed=0, scratch=tmp_path / "scratch"))


def test_honest_candidate_with_warmup_passes_over_three_seeds(data_dir, tmp_path):
    f = fitness(
        data_dir,
        n_seeds=3,
        target=6.0,
        cpu_parallel=2,
        overrides={"steps": 60, "compile_warmup_steps": 1},
    )
    result = evaluate(f, candidate(tmp_path), tmp_path)
    assert result.status == EvalStatus.OK, result.artifacts
    assert result.stage == "all_seeds" and result.seeds == (0, 1, 2)
    m = result.metrics
    assert m["pvalue"] < 0.01 and m["loss_mean"] < 6.0
    assert result.fitness == pytest.approx(m["time_mean_s"]) and result.fitness > 0
    assert m["init_loss_0"] == pytest.approx(math.log(512), abs=0.1)  # untrained at the start
    assert m["overhead_mean_s"] > m["eval_mean_s"] > 0


def test_stopping_the_clock_early_and_training_on_is_rejected(data_dir, tmp_path):
    folder = candidate(
        tmp_path,
        (
            "\n    speedrun_clock.stop(raw)\n",
            '\n    speedrun_clock._save(raw, speedrun_clock._path("final.pt"))\n',
        ),
        (
            "        speedrun_clock.tick(raw)\n",
            "        speedrun_clock.tick(raw)\n        if step == 3:\n"
            "            kept = batches.next(device)  # the stream ends at the stop: replay this\n"
            "            speedrun_clock.stop(raw)\n"
            "            batches.next = lambda device, kept=kept: kept\n",
        ),
    )
    result = evaluate(fitness(data_dir, overrides=QUICK), folder, tmp_path)
    assert result.status == EvalStatus.REJECTED
    assert "final checkpoint changed after the clock stopped" in result.artifacts["error"]


def test_training_during_warmup_without_restoring_is_rejected(data_dir, tmp_path):
    folder = candidate(
        tmp_path,
        (
            "        raw.load_state_dict(saved_model)\n        optimizer.load_state_dict(saved_opt)\n",
            "        pass\n",
        ),
    )
    result = evaluate(
        fitness(data_dir, overrides={**QUICK, "compile_warmup_steps": 3}), folder, tmp_path
    )
    assert result.status == EvalStatus.REJECTED
    assert (
        "warm-up changed the model or optimizer state and did not restore it"
        in result.artifacts["error"]
    )


def test_a_candidate_reporting_its_own_loss_is_scored_by_the_harness(data_dir, tmp_path):
    fake = (
        "\nif __name__ != '__main__':  # imported by the evaluator: try to fake the loss\n"
        "    torch.logsumexp = lambda *a, **k: torch.zeros(())\n"
        "    torch.gather = lambda logits, *a, **k: logits.new_zeros(logits.shape[:-1] + (1,))\n"
        "    F.cross_entropy = lambda *a, **k: torch.tensor(1.0)\n"
    )
    folder = candidate(
        tmp_path,
        ("\n# EVOLVE-BLOCK-START\n", fake + "\n# EVOLVE-BLOCK-START\n"),
        (
            '    if rank == 0:\n        print(f"trained_tokens=',
            "    if rank == 0:\n        print('val_loss 1.0000')\n"
            "        open('val_loss.json', 'w').write('{\"val_loss\": 1.0}')\n        print(f\"trained_tokens=",
        ),
    )
    result = evaluate(
        fitness(data_dir, overrides={"steps": 2, "warmup_steps": 1}), folder, tmp_path
    )
    assert result.status == EvalStatus.INVALID
    assert result.metrics["loss_0"] > 5.8  # the harness's own measurement, not the 1.0 it printed
    assert "is not below the target 5.6" in result.artifacts["error"]


def test_exceeding_the_warmup_cap_is_rejected(data_dir, tmp_path):
    folder = candidate(
        tmp_path,
        (
            "    speedrun_clock.start(raw, optimizer)\n",
            "    time.sleep(4)\n    speedrun_clock.start(raw, optimizer)\n",
        ),
    )
    result = evaluate(fitness(data_dir, warmup_cap_s=3, overrides=QUICK), folder, tmp_path)
    assert result.status == EvalStatus.REJECTED
    assert "over the cap of 3 s" in result.artifacts["error"]


def test_training_before_the_clock_starts_is_rejected(data_dir, tmp_path):
    folder = candidate(
        tmp_path,
        (
            "    speedrun_clock.start(raw, optimizer)\n",
            "    for _ in range(60):  # at the peak learning rate, untimed\n"
            "        train_step(model, optimizer, batches, 10, accum, c, device)\n"
            "    speedrun_clock.start(raw, optimizer)\n",
        ),
    )
    result = evaluate(fitness(data_dir, overrides=QUICK), folder, tmp_path)
    assert result.status == EvalStatus.REJECTED
    assert "not the model that torch.manual_seed(EVOLVE_SEED)" in result.artifacts["error"]


def test_a_model_that_looks_ahead_is_rejected(data_dir, tmp_path):
    folder = candidate(
        tmp_path,
        (
            "x = self.wte(idx) + self.wpe(pos)",
            "x = self.wte(torch.roll(idx, -1, 1)) + self.wpe(pos)",
        ),
    )
    result = evaluate(fitness(data_dir, overrides=QUICK), folder, tmp_path)
    assert result.status == EvalStatus.REJECTED
    assert "the model is not causal" in result.artifacts["error"]


def test_ddp_through_torchrun_with_two_processes(data_dir, tmp_path):
    f = fitness(
        data_dir,
        target=5.9,
        nproc_per_node=2,
        overrides={"micro_batch": 8, "steps": 80, "compile_warmup_steps": 1},
    )
    result = evaluate(f, candidate(tmp_path), tmp_path)
    assert result.status == EvalStatus.OK, result.artifacts
    assert result.metrics["loss_0"] < 5.9


def test_with_a_compile_cache_the_seed_is_trained_exported_and_scored(data_dir, tmp_path):
    # the export and the evaluation read the shared cache too (an export pointed at a copy its
    # sandbox hides failed with PermissionError: issue 30), with and without the GPU path
    for gpu in (None, "0"):
        cache = str(tmp_path / "cache")
        f = fitness(data_dir, n_seeds=1, target=7.0, compile_cache=cache, overrides=QUICK)
        ctx = EvalContext(seed=0, gpu=gpu, scratch=tmp_path / f"scratch-{gpu}")
        result = evaluate_safely(f, SEED.parent, ctx)
        assert result.ok and result.metrics["loss_0"] < 7.0, (gpu, dict(result.artifacts))


def test_the_harness_fills_the_compile_cache_once_with_the_seed(data_dir, tmp_path, monkeypatch):
    from evolve.benchmarks.speedrun import fitness as speedrun_fitness

    # a stand-in seed that compiles nothing and leaves a file where torch.compile's cache goes
    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / "train.py").write_text(
        "import os, pathlib\n"
        "folder = pathlib.Path(os.environ['TORCHINDUCTOR_CACHE_DIR'])\n"
        "folder.mkdir(parents=True, exist_ok=True)\n"
        "(folder / 'compiled-by-the-seed').write_text('kernel')\n"
    )
    monkeypatch.setattr(speedrun_fitness, "SEED_PROGRAM", seed)
    cache = tmp_path / "cache"
    f = fitness(data_dir, n_seeds=1, target=7.0, compile_cache=str(cache))
    assert [s.name for s in f.stages] == ["cache_warmup", "first_seed", "all_seeds"]
    ctx = EvalContext(seed=0, scratch=tmp_path / "scratch")
    assert f.cache_warmup(tmp_path, ctx).metrics == {"cache_warmup_ok": 1}
    assert (cache / "inductor" / "compiled-by-the-seed").read_text() == "kernel"
    [record] = cache.glob("warmed-*.json")
    # another worker's fitness reads the record instead of warming again
    record.write_text('{"status": "marked"}')
    again = fitness(data_dir, n_seeds=1, target=7.0, compile_cache=str(cache))
    assert again.cache_warmup(tmp_path, ctx).metrics == {"cache_warmup_ok": 0}
    # a candidate's run reads it through a private layer: what it writes there never reaches it
    # (tests/harness/test_compile_cache.py, tests/redteam/test_speedrun.py)
