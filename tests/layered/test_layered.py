"""Layered checks on a tiny trainer: broken candidates stop at the cheap stage that catches them.

The end-to-end cases run torch in the sandbox (~2 minutes on 2 cores): ``pytest -m slow tests/layered``.
"""

from __future__ import annotations

import math
import pickle
import re

import pytest
from evolve.benchmarks.nanochat.layered import (
    LocalCheck,
    LossBand,
    ShortRun,
    cascade,
    compare_tensors,
)

from evolve.harness.fitness import EvalContext, Stage, evaluate_safely, write_files
from evolve.types import EvalStatus, Evaluation
from tests.layered.toy_trainer import SEED, local_probe, train_probe

CTX = EvalContext(seed=5, timeout_s=60)


def full_run(workdir, ctx):  # the benchmark's own evaluation (here: trivially OK)
    return Evaluation(status=EvalStatus.OK, fitness=1.0, metrics={"full": 1.0})


class Trainer:
    """A fitness whose stages are the layered checks, then the full run."""

    def __init__(self):
        self.local = LocalCheck(probe=local_probe, seed_files=SEED, zero_keys=("causality",))
        self.short = ShortRun(train=train_probe, seed_files=SEED, steps=30, seeds=(0, 1, 2))
        self.stages = cascade(self.local, self.short, full=Stage(name="full", run=full_run))

    def evaluate(self, workdir, ctx):
        return full_run(workdir, ctx)


@pytest.fixture(scope="module")
def trainer():
    return Trainer()


def run(trainer, tmp_path, edits=(), seed=5):
    text = SEED["model.py"]
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    write_files({"model.py": text}, tmp_path)
    return evaluate_safely(trainer, tmp_path, EvalContext(seed=seed, timeout_s=60))


@pytest.mark.slow  # sandboxed torch runs: ~2 min on 2 cores
def test_the_seed_and_honest_variants_pass_every_stage(trainer, tmp_path):
    for i, (edits, seed) in enumerate(
        [
            ((), 5),
            ((), 11),
            ((("WIDTH = 32", "WIDTH = 48"),), 5),
            ((("torch.nn.GELU()", "torch.nn.SiLU()"),), 5),
        ]
    ):
        result = run(trainer, tmp_path / str(i), edits, seed)
        assert result.ok and result.stage == "full", (edits, result.artifacts)
        assert result.metrics["local_check_ok"] == 1 and math.isfinite(
            result.metrics["short_run_loss"]
        )


@pytest.mark.slow  # sandboxed torch runs: ~2 min on 2 cores
def test_nan_weights_stop_at_the_local_check(trainer, tmp_path):
    result = run(
        trainer,
        tmp_path,
        [
            (
                "return Net(vocab)",
                "net = Net(vocab)\n    torch.nn.init.constant_(net.head[0].weight, float('nan'))\n    return net",
            )
        ],
    )
    assert result.status == EvalStatus.INVALID and result.stage == "local_check"
    assert "non-finite" in result.artifacts["error"]


@pytest.mark.slow  # sandboxed torch runs: ~2 min on 2 cores
def test_looking_at_future_tokens_stops_at_the_local_check(trainer, tmp_path):
    result = run(
        trainer,
        tmp_path,
        [("context = h.cumsum(1) / steps", "context = h.mean(1, keepdim=True).expand_as(h)")],
    )
    assert result.status == EvalStatus.INVALID and result.stage == "local_check"
    assert "causality" in result.artifacts["error"]


@pytest.mark.slow  # sandboxed torch runs: ~2 min on 2 cores
def test_a_learning_rate_that_does_not_learn_stops_at_the_short_run(trainer, tmp_path):
    result = run(trainer, tmp_path, [("LR = 0.03", "LR = 0.0")])
    assert result.status == EvalStatus.INVALID and result.stage == "short_run"
    assert "above the seed's band" in result.artifacts["error"]


@pytest.mark.slow  # sandboxed torch runs: ~2 min on 2 cores
def test_a_diverging_run_stops_at_the_short_run(trainer, tmp_path):
    result = run(trainer, tmp_path, [("LR = 0.03", "LR = 1e6")])
    assert result.status == EvalStatus.INVALID and result.stage == "short_run"
    assert re.search(r"diverged|above the seed's band", result.artifacts["error"])


@pytest.mark.slow  # sandboxed torch runs: ~2 min on 2 cores
def test_a_crashing_candidate_reports_the_stage(trainer, tmp_path):
    result = run(
        trainer,
        tmp_path,
        [("def build(vocab):", "def build(vocab):\n    raise RuntimeError('oops')")],
    )
    assert (
        result.status == EvalStatus.ERROR
        and "local_check: probe exited with status 1" in result.artifacts["error"]
    )


def test_the_stages_pickle_with_their_calibration(trainer):
    clone = pickle.loads(pickle.dumps(trainer))
    assert [s.name for s in clone.stages] == ["local_check", "short_run", "full"]


def test_loss_band_and_tensor_comparison_edges():
    band = LossBand.from_trajectories([[3.0, 2.0, 1.0], [3.2, 2.2, 1.2]], steps=[2])
    assert band.mean == (pytest.approx(1.1),) and band.check([3, 2, 1.1]) is None
    assert "diverged" in band.check([3, float("nan"), 1.0])
    assert "needs 3" in band.check([3.0])
    assert "above" in band.check([3, 2, 5.0])
    assert LossBand.from_json(band.to_json()) == band
    with pytest.raises(ValueError, match="do not reach"):
        LossBand.from_trajectories([[1.0]], steps=[3])
    ref = {"x": [[1.0, 2.0]], "loss": 2.0}
    assert compare_tensors({"x": [[1.1, 2.1]], "loss": 2.2}, ref) is None
    assert "shape" in compare_tensors({"x": [1.0, 2.0], "loss": 2.0}, ref)
    assert "no 'loss'" in compare_tensors({"x": [[1.0, 2.0]]}, ref)
    assert "scale" in compare_tensors({"x": [[100.0, 200.0]], "loss": 2.0}, ref)
    assert "~0" in compare_tensors(
        {"x": [[1.0, 2.0]], "loss": 2.0, "c": 0.1}, ref, zero_keys=("c",)
    )


def test_upper_keys_may_vanish_but_not_explode():
    ref = {"grad": 2.0, "loss": 2.0}
    vanished = {"grad": 0.0, "loss": 2.0}
    assert "within" in compare_tensors(vanished, ref)
    assert compare_tensors(vanished, ref, upper_keys=("grad",)) is None
    exploded = compare_tensors({"grad": 2e4, "loss": 2.0}, ref, upper_keys=("grad",))
    assert "grad has scale 2e+04" in exploded and "at most x10" in exploded
    assert "non-finite" in compare_tensors(
        {"grad": math.nan, "loss": 2.0}, ref, upper_keys=("grad",)
    )
