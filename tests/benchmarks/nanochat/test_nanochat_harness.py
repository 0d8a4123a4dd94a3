"""The harness owns the measurement: honest candidates pass, cheaters and overrunners are refused.

Each test trains a variant of the CPU seed for a 2-second budget on a tiny dataset and
scores it with the real supervisor, scorer and sandbox.
"""

from pathlib import Path

import pytest
from evolve.benchmarks.nanochat import prepare
from evolve.benchmarks.nanochat.fitness import NanochatFitness

from evolve.harness.fitness import EvalContext, evaluate_safely
from evolve.types import EvalStatus, EvolveError
from tests.fixtures.nanochat_tiny import tiny_fitness

SEED = Path(prepare.__file__).parent / "seed"
TRAIN_STEP = (
    "    if not clock.step(tokens=len(micro) * x.numel(), loss=loss.item()):\n        break\n"
)


def fitness(data_dir: Path, **overrides) -> NanochatFitness:
    return tiny_fitness(data_dir, **overrides)


def run(data_dir: Path, tmp_path: Path, edit=None, **overrides):
    files = {p.name: p.read_text() for p in SEED.glob("*.py")}
    if edit:
        edit(files)
    work = tmp_path / "work"
    work.mkdir()
    for name, text in files.items():
        (work / name).write_text(text)
    return evaluate_safely(
        fitness(data_dir, **overrides), work, EvalContext(seed=0, scratch=tmp_path)
    )


def test_honest_candidate_is_scored_by_the_harness(data_dir, tmp_path):
    def print_fake(files):  # printing a score changes nothing: the harness computes its own
        files["train.py"] += (
            '\nprint("val_bpb: 0.0001")\nprint("{\\"status\\": \\"ok\\", \\"val_bpb\\": 0.0001}")\n'
        )

    ev = run(data_dir, tmp_path, print_fake)
    assert ev.status == EvalStatus.OK, dict(ev.artifacts)
    assert 1.0 < ev.fitness < 12.0
    metrics = ev.metrics
    assert metrics["steps"] > 11 and metrics["training_s"] >= 2.0
    assert metrics["max_prefix_diff"] == 0.0 and metrics["max_row_diff"] == 0.0
    assert metrics["eval_targets"] > 0 and metrics["params"] > 0
    assert set(ev.descriptors) == {"log10_params", "log10_tokens"}


def test_fake_score_without_training_is_refused(data_dir, tmp_path):
    def fake(files):
        files["train.py"] = (
            'print("val_bpb: 0.0001")\nprint(\'{"status": "ok", "val_bpb": 0.0001}\')\n'
        )

    ev = run(data_dir, tmp_path, fake)
    assert not ev.ok and ev.fitness is None
    assert "checkpoint" in ev.artifacts["error"]


def test_reading_validation_data_is_rejected(data_dir, tmp_path):
    def peek(files):  # looks next to its training data, swallows the error, then trains honestly
        files["train.py"] = files["train.py"].replace(
            "torch.manual_seed(settings.seed)\n",
            "torch.manual_seed(settings.seed)\nimport pathlib\n"
            "try:\n    (pathlib.Path(next(p for p in __import__('json').loads(__import__('os').environ['NANOCHAT_CONFIG'])['forbidden'] if p.endswith('val'))) / 'tokens.bin').read_bytes()\n"
            "except OSError:\n    pass\n",
        )

    ev = run(data_dir, tmp_path, peek)
    assert ev.status == EvalStatus.REJECTED
    assert "forbidden" in ev.artifacts["error"]


def test_non_causal_model_is_rejected(data_dir, tmp_path):
    def peek_ahead(files):
        files["model.py"] = files["model.py"].replace("is_causal=True", "is_causal=False")

    ev = run(data_dir, tmp_path, peek_ahead)
    assert ev.status == EvalStatus.REJECTED
    assert "not causal" in ev.artifacts["error"]


def test_training_past_the_budget_is_rejected(data_dir, tmp_path):
    def ignore_stop(files):  # the data stream ends at the stop: it trains on on its last batch
        assert TRAIN_STEP in files["train.py"]
        files["train.py"] = (
            files["train.py"]
            .replace(TRAIN_STEP, "    clock.step(tokens=GRAD_ACCUM * x.numel())\n")
            .replace("next(batches, None) for", "next(batches, None) or (x, y) for")
        )

    ev = run(data_dir, tmp_path, ignore_stop)
    assert ev.status == EvalStatus.REJECTED
    assert "budget overrun" in ev.artifacts["error"]
    assert ev.metrics["training_s"] < 2.0 + 15.0


def test_training_before_the_clock_starts_is_cut_off(data_dir, tmp_path):
    def slow_start(files):  # work before step 11 is untimed, so it has a wall limit of its own
        files["train.py"] = files["train.py"].replace(
            "clock = client.Clock()\n", "clock = client.Clock()\ntime.sleep(60)\n"
        )

    ev = run(data_dir, tmp_path, slow_start, startup_limit_s=8.0)
    assert ev.status == EvalStatus.TIMEOUT
    assert "startup limit" in ev.artifacts["error"]


def test_start_up_beyond_the_allowance_is_taken_off_the_budget(data_dir, tmp_path):
    def slow_start(files):  # 4 s of "warm-up" before the first step, with no free start-up at all
        files["train.py"] = files["train.py"].replace(
            "clock = client.Clock()\n", "clock = client.Clock()\ntime.sleep(4)\n"
        )

    ev = run(data_dir, tmp_path, slow_start, free_startup_s=0.0, budget_s=3.0)
    assert ev.status == EvalStatus.OK, dict(ev.artifacts)
    assert ev.metrics["startup_charged_s"] > 4.0
    assert ev.metrics["training_s"] < 3.0  # what was left of the budget, plus at most one step


def test_a_validation_split_too_short_for_eval_tokens_fails_at_start_naming_the_fix(data_dir):
    with pytest.raises(EvolveError, match=r"eval_tokens=0"):
        fitness(data_dir, eval_tokens=64 * 8 * 10_000)
    assert fitness(data_dir, eval_tokens=0).scale.eval_tokens > 0  # every whole batch it holds
