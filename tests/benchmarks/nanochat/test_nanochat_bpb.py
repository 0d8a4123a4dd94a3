"""Bits per byte against hand-computed values."""

import math

import pytest
import torch
from evolve.benchmarks.nanochat.bpb import BpbSums, batch_sums, target_nats


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
