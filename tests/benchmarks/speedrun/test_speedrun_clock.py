"""The clock: marks travel over the socket and are stamped by the harness; the audit's rules."""

from __future__ import annotations

import copy
import importlib.util
import time

import pytest
import torch
from evolve.benchmarks.speedrun.runner import CLOCK_MODULE, sha256_file
from evolve.benchmarks.speedrun.timer import ClockServer, ClockViolation, Mark, audit


@pytest.fixture
def clock(monkeypatch, tmp_path):
    """A fresh copy of the candidate-side module, pointed at ``tmp_path`` for checkpoints."""
    spec = importlib.util.spec_from_file_location("speedrun_clock_under_test", CLOCK_MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setenv("SPEEDRUN_CKPT_DIR", str(tmp_path))
    return module


def _marks(*events: tuple[str, float, dict]) -> list[Mark]:
    return [Mark(event=e, t=t, fields=f) for e, t, f in events]


def test_marks_arrive_stamped_by_the_harness_and_the_checkpoint_hash_matches(
    clock, monkeypatch, tmp_path
):
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    with ClockServer() as server:
        monkeypatch.setenv("SPEEDRUN_CLOCK", server.address)
        launch = time.monotonic()
        clock.warmup_begin(model, optimizer)
        saved_model, saved_opt = (
            copy.deepcopy(model.state_dict()),
            copy.deepcopy(optimizer.state_dict()),
        )
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        assert (
            clock.state_digest(model, optimizer) != server.marks[0].fields["state"]
        )  # warm-up changed it
        model.load_state_dict(saved_model)
        optimizer.load_state_dict(saved_opt)
        clock.start(model, optimizer)
        time.sleep(0.2)
        clock.stop(model)
        marks = list(server.marks)
    assert [m.event for m in marks] == ["warmup_begin", "start", "stop"]
    timing = audit(marks, [], launch_t=launch, warmup_cap_s=60)
    assert 0.2 <= timing.train_s < 5
    assert timing.final_sha256 == sha256_file(tmp_path / "final.pt")
    assert timing.init_sha256 == sha256_file(tmp_path / "init.pt")


def test_without_a_harness_the_marks_only_print(clock, monkeypatch, capsys):
    monkeypatch.delenv("SPEEDRUN_CLOCK", raising=False)
    model = torch.nn.Linear(2, 2)
    clock.start(model)
    clock.stop(model)
    assert "(no harness)" in capsys.readouterr().out


START = ("start", 10.0, {"state": "s0", "init_sha256": "i"})
STOP = ("stop", 20.0, {"sha256": "f"})


def test_a_clean_run_is_timed_from_start_to_stop():
    timing = audit(
        _marks(("warmup_begin", 5.0, {"state": "s0", "init_sha256": "i"}), START, STOP),
        [],
        launch_t=0.0,
        warmup_cap_s=60,
    )
    assert (timing.train_s, timing.untimed_s, timing.init_sha256, timing.final_sha256) == (
        10.0,
        10.0,
        "i",
        "f",
    )


@pytest.mark.parametrize(
    ("marks", "reason"),
    [
        ((STOP,), "never started"),
        ((START,), "never stopped"),
        ((START, STOP, ("start", 21.0, {}), ("stop", 22.0, {})), "out of order"),
        ((("stop", 1.0, {}), START, STOP), "out of order"),
        ((START, ("pause", 12.0, {}), ("resume", 13.0, {}), STOP), "the clock was paused"),
        (
            (("warmup_begin", 5.0, {"state": "s0"}), ("start", 10.0, {"state": "s1"}), STOP),
            "did not restore it",
        ),
    ],
)
def test_broken_rules_are_named(marks, reason):
    with pytest.raises(ClockViolation, match=reason):
        audit(_marks(*marks), [], launch_t=0.0, warmup_cap_s=60)


def test_the_warmup_cap_counts_from_launch():
    with pytest.raises(ClockViolation, match="took 10.0 s, over the cap of 9 s"):
        audit(_marks(START, STOP), [], launch_t=0.0, warmup_cap_s=9)


def test_pauses_are_excluded_only_when_probes_were_asked_for():
    marks = _marks(
        START, ("pause", 12.0, {}), ("resume", 13.5, {"path": "probe-001.pt", "sha256": "p"}), STOP
    )
    timing = audit(marks, [], launch_t=0.0, warmup_cap_s=60, allow_probes=True)
    assert timing.train_s == pytest.approx(8.5)
    assert timing.probes == ((2.0, "probe-001.pt", "p"),)


def test_protocol_problems_reject_the_run():
    with pytest.raises(ClockViolation, match="second connection"):
        audit(
            _marks(START, STOP),
            ["a second connection to the clock (only rank 0 may mark time)"],
            launch_t=0.0,
            warmup_cap_s=60,
        )
