"""The harness's token stream and the evaluation's row layout: what the candidate gets when, and what the probes check."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
from evolve.benchmarks.speedrun.runner import CLOCK_MODULE
from evolve.benchmarks.speedrun.scoring import CUT_STRATUM, causal_violation, layout
from evolve.benchmarks.speedrun.shards import write_shard
from evolve.benchmarks.speedrun.stream import TokenServer


@pytest.fixture
def clock(monkeypatch):
    spec = importlib.util.spec_from_file_location("speedrun_clock_stream_test", CLOCK_MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tokens_are_random_before_start_real_while_running_and_end_at_stop(
    clock, monkeypatch, tmp_path
):
    real = [np.arange(100, dtype=np.uint16) % 50, np.arange(30, dtype=np.uint16) + 200]
    files = [tmp_path / f"train_{i}.bin" for i in range(len(real))]
    for path, tokens in zip(files, real, strict=True):
        write_shard(path, tokens)
    stream = np.concatenate(real)
    phase = ["before"]
    with TokenServer(files, vocab_size=512, phase=lambda: phase[0], seed=1) as server:
        monkeypatch.setenv("SPEEDRUN_DATA", server.address)
        early = clock.tokens(0, 65)
        assert early.shape == (65,) and early.max() < 512 and not (early == stream[:65]).all()
        phase[0] = "running"
        assert (clock.tokens(0, 65) == stream[:65]).all()
        assert (clock.tokens(120, 20) == np.concatenate([stream[120:], stream[:10]])).all()  # wraps
        phase[0] = "after"
        with pytest.raises(EOFError, match="ended when the clock stopped"):
            clock.tokens(0, 8)
    assert server.served == 85 and server.synthetic == 65


def test_without_a_harness_tokens_come_from_the_shards(clock, monkeypatch, tmp_path):
    path = tmp_path / "train_0.bin"
    write_shard(path, np.arange(10, dtype=np.uint16))
    monkeypatch.delenv("SPEEDRUN_DATA", raising=False)
    monkeypatch.setenv("SPEEDRUN_TRAIN_FILES", str(path))
    assert clock.tokens(8, 4).tolist() == [8, 9, 0, 1]


def _nats(inputs: np.ndarray, targets: np.ndarray, lookahead: int = 0) -> np.ndarray:
    """Losses of a toy model: a hash of the inputs up to t (+ ``lookahead`` tokens) and the target."""
    out = np.zeros(inputs.shape)
    for r in range(inputs.shape[0]):
        for t in range(inputs.shape[1]):
            seen = inputs[r, : t + 1 + lookahead]
            out[r, t] = (hash(seen.tobytes()) % 1000 + int(targets[r, t])) / 1000
    return out


def test_the_layout_hides_probes_among_scored_rows_and_catches_a_one_token_peek():
    rng = np.random.default_rng(0)
    val = rng.integers(0, 512, 64 * 40 + 1).astype(np.uint16)
    plan = layout(val, 64, 8, rng)
    assert plan.inputs.shape[0] % 8 == 0 and plan.inputs.shape == plan.targets.shape
    scored = plan.scored[plan.scored >= 0]
    assert sorted(scored.tolist()) == list(range(40))  # every validation row scored once
    probes = plan.base >= 0
    cuts = sorted(plan.cut[probes & (plan.cut < 64)].tolist())
    assert len(cuts) >= math.ceil(63 / CUT_STRATUM)
    gaps = np.diff([0, *cuts, 64])
    assert gaps.max() < 2 * CUT_STRATUM  # cuts in every stretch of the sequence
    assert (plan.cut[probes] == 64).any()  # untouched rows check row independence
    batches = plan.scored.reshape(-1, 8)
    kinds = ["S" if (b >= 0).any() else "P" for b in batches]
    assert "PS" in "".join(kinds) and "SP" in "".join(kinds)  # interleaved
    assert causal_violation(_nats(plan.inputs, plan.targets), plan)[0] == 0
    worst, where = causal_violation(_nats(plan.inputs, plan.targets, lookahead=1), plan)
    assert worst > 0 and "changed from position" in where


def test_a_model_depending_on_its_batch_neighbours_is_caught():
    rng = np.random.default_rng(1)
    val = rng.integers(0, 512, 32 * 24 + 1).astype(np.uint16)
    plan = layout(val, 32, 4, rng)
    nats = _nats(plan.inputs, plan.targets)
    batch_mean = plan.inputs.reshape(-1, 4, 32).mean(axis=(1, 2))
    worst, where = causal_violation(nats + np.repeat(batch_mean, 4)[:, None] / 100, plan)
    assert worst > 0 and where
