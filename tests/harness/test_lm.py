"""Bits per byte against hand-computed values."""

import math

import numpy as np
import pytest
import torch

from evolve.harness.lm import (
    BpbSums,
    batch_sums,
    make_probes,
    perturb_,
    probe_diffs,
    stratified_cuts,
    target_nats,
)


def test_uniform_logits_give_log2_vocab_bits_per_token_over_bytes():
    # vocab 3, all logits equal: every target costs ln 3 nats.
    logits = torch.zeros(1, 3, 3)
    targets = torch.tensor([[1, 2, 0]])
    token_bytes = torch.tensor([0, 1, 2])  # token 0 is special: 0 bytes, not scored
    nats, n_bytes, counted = batch_sums(logits, targets, token_bytes)
    assert counted == 2
    assert n_bytes == 3
    assert nats == pytest.approx(2 * math.log(3))
    sums = BpbSums()
    sums.add(nats, n_bytes, counted)
    assert sums.bpb == pytest.approx(2 * math.log2(3) / 3)  # 1.0566...


def test_hand_computed_two_positions():
    # position 0: logits (ln 1, ln 2, ln 1) -> p = (1/4, 2/4, 1/4); target 1 -> -ln(1/2)
    # position 1: logits (0, 0, ln 2)       -> p = (1/4, 1/4, 2/4); target 0 -> -ln(1/4)
    logits = torch.log(torch.tensor([[[1.0, 2.0, 1.0], [1.0, 1.0, 2.0]]]))
    targets = torch.tensor([[1, 0]])
    assert target_nats(logits, targets).tolist()[0] == pytest.approx([math.log(2), math.log(4)])
    token_bytes = torch.tensor([3, 2, 1])
    nats, n_bytes, counted = batch_sums(logits, targets, token_bytes)
    assert (n_bytes, counted) == (5, 2)
    expected_bpb = (math.log(2) + math.log(4)) / (math.log(2) * 5)  # = 3 bits / 5 bytes = 0.6
    sums = BpbSums(nats=nats, bytes=n_bytes, targets=counted)
    assert sums.bpb == pytest.approx(0.6)
    assert sums.bpb == pytest.approx(expected_bpb)


def test_logit_shift_does_not_change_the_score():
    logits = torch.randn(2, 5, 7)
    targets = torch.randint(0, 7, (2, 5))
    token_bytes = torch.arange(7)
    shifted = logits - logits.amax(dim=-1, keepdim=True)
    assert batch_sums(logits, targets, token_bytes)[0] == pytest.approx(
        batch_sums(shifted, targets, token_bytes)[0]
    )


def test_no_bytes_is_an_error():
    with pytest.raises(ValueError, match="no target"):
        _ = BpbSums().bpb


# --- causality and row-independence probes -------------------------------------------------------

VOCAB = 7


def causal_logits(rows: np.ndarray) -> torch.Tensor:
    """Logits at t from the running sum of inputs 0..t (causal, rows independent)."""
    x = torch.from_numpy(rows[:, :-1].astype(np.int64))
    return torch.nn.functional.one_hot(x.cumsum(1) % VOCAB, VOCAB).float()


def peeking_logits(rows: np.ndarray) -> torch.Tensor:
    """Also looks at the next input at t (the future)."""
    x = torch.from_numpy(rows[:, :-1].astype(np.int64))
    ahead = torch.roll(x, -1, dims=1)
    return torch.nn.functional.one_hot((x.cumsum(1) + ahead) % VOCAB, VOCAB).float()


def row_mixing_logits(rows: np.ndarray) -> torch.Tensor:
    """Adds the batch's first row at each position (other rows leak in)."""
    x = torch.from_numpy(rows[:, :-1].astype(np.int64))
    return torch.nn.functional.one_hot((x.cumsum(1) + x[:1].cumsum(1)) % VOCAB, VOCAB).float()


def probe_worst(logits_of, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    batches = [rng.integers(0, VOCAB, size=(4, 33)) for _ in range(3)]
    spare = rng.integers(0, VOCAB, size=(2, 33))
    probes = make_probes(batches, spare, 4, rng)
    diffs = [probe_diffs(logits_of(batches[p.base]), logits_of(p.rows), p) for p in probes]
    return max(d[0] for d in diffs), max(d[1] for d in diffs)


def test_stratified_cuts_cover_every_position_range():
    cuts = stratified_cuts(8, 65, np.random.default_rng(3))
    assert sorted(c // 8 for c in cuts) == list(range(8))  # one cut in each eighth of [1, 64]
    assert all(1 <= c <= 63 for c in cuts)


def test_probe_bases_cover_every_batch_before_any_repeats():
    rng = np.random.default_rng(2)
    batches = [rng.integers(0, VOCAB, size=(4, 33)) for _ in range(5)]
    spare = rng.integers(0, VOCAB, size=(2, 33))
    for count in (5, 7, 12):
        bases = [p.base for p in make_probes(batches, spare, count, rng)]
        assert sorted(bases[:5]) == list(range(5))  # each batch once in the first round
        assert max(bases.count(b) for b in range(5)) == -(-count // 5)


def test_probes_pass_a_causal_model_and_catch_peeking_and_row_mixing():
    assert probe_worst(causal_logits) == (0.0, 0.0)
    assert probe_worst(peeking_logits)[0] > 0
    assert probe_worst(row_mixing_logits)[1] > 0


def test_probes_are_shuffled_copies_with_other_futures():
    rng = np.random.default_rng(1)
    batch = rng.integers(0, 1000, size=(8, 17))
    (probe,) = make_probes([batch], rng.integers(0, 1000, size=(2, 17)), 1, rng)
    assert sorted(probe.order) == list(range(8)) and list(probe.order) != list(range(8))
    changed = [i for i, cut in enumerate(probe.cuts) if cut < 17]
    assert len(changed) == 4
    for i, (source, cut) in enumerate(zip(probe.order, probe.cuts, strict=True)):
        assert (probe.rows[i, :cut] == batch[source, :cut]).all()
        if cut < 17:
            assert probe.rows[i, cut] != batch[source, cut]


def test_perturbing_wakes_zero_initialised_weights():
    layer = torch.nn.Linear(4, 4)
    torch.nn.init.zeros_(layer.weight)
    perturb_(layer, torch.Generator().manual_seed(0))
    assert float(layer.weight.detach().abs().min()) > 0


def test_perturbing_opens_a_zero_gate_wide_enough_for_bf16_logits():
    # the H200 miss, on the CPU: the GPU seed's size, a scalar gate at zero in front of the
    # next token's embedding, bf16 autocast, and the GPU scale's tolerance
    import sys
    from pathlib import Path

    from evolve.benchmarks.nanochat.scales import SCALES

    sys.path.insert(0, str(Path(__file__).parents[1] / "redteam"))
    import nanochat_programs as programs

    namespace: dict = {}
    exec(compile(programs.edited(programs.ZERO_PATHS["zero_gate"])["model.py"], "model.py", "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["build_model"](dict(vocab_size=512, seq_len=256, n_layer=8, n_head=8, n_embd=512,
                                          mlp_ratio=4, init_std=0.02)).eval()  # fmt: skip
    perturb_(model, torch.Generator().manual_seed(1))
    tokens = torch.randint(0, 512, (2, 256))
    probe = tokens.clone()
    probe[:, 100:] = (probe[:, 100:] + 1) % 512
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        diff = (model(tokens).float() - model(probe).float())[:, :100].abs().max()
    assert float(diff) > 10 * SCALES["nanochat"].causal_atol
