"""Where an evaluation's wall time goes: the phase timeline, and circle packing's phases adding up to wall_s."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from evolve.benchmarks.circle_packing import fitness as circle_packing

from evolve.harness import phases
from evolve.harness.fitness import EvalContext, evaluate_safely
from evolve.types import EvalStatus


def assert_adds_up(evaluation, *, at_least: int = 5) -> dict[str, float]:
    """The evaluation's ``time_<phase>`` metrics: at least ``at_least``, non-negative, summing to wall_s within 2%."""
    spent = {k: v for k, v in evaluation.metrics.items() if phases.is_phase(k)}
    assert len(spent) >= at_least, spent
    assert all(v >= 0 for v in spent.values()), spent
    assert sum(spent.values()) == pytest.approx(evaluation.wall_s, rel=0.02), (
        spent,
        evaluation.wall_s,
    )
    return spent


def test_marks_cut_one_timeline_in_time_order_and_repeated_phases_add_up():
    line = phases.Timeline("harness", 10.0)
    line.mark("training", at=11.0)
    line.mark("scoring", at=13.5)
    line.mark("training", at=14.0)
    line.mark("checkpoint", at=12.0)  # learnt later (a harness process's report): falls into place
    line.mark("startup", at=9.0)  # before the start: counts from it
    assert line.seconds(15.0) == {
        "harness": 0.0,
        "startup": 1.0,
        "training": 2.0,
        "checkpoint": 1.5,
        "scoring": 0.5,
    }


def test_marks_outside_an_evaluation_do_nothing_and_bad_names_name_the_fix():
    phases.mark("training")  # no timeline: a measurement script calling a fitness directly
    with phases.timeline("harness") as line, pytest.raises(ValueError, match="lowercase words"):
        line.mark("time_s")
    assert phases.slug("Short run 2") == "short_run" and phases.slug("first_seed") == "first_seed"


def test_other_seconds_metrics_are_not_phases():
    assert phases.is_phase("time_training")
    assert not any(map(phases.is_phase, ("time_mean_s", "time_s_0", "time_std_s", "train_s")))


def test_a_stage_without_marks_is_one_phase_and_the_phases_add_up_to_wall_s(tmp_path):
    class Slow:
        objective = circle_packing.CirclePacking.objective
        descriptors = ()

        def evaluate(self, workdir: Path, ctx: EvalContext):
            time.sleep(0.05)
            return circle_packing.Evaluation(status=EvalStatus.OK, fitness=1.0)

    ev = evaluate_safely(Slow(), tmp_path, EvalContext())
    spent = assert_adds_up(ev, at_least=2)
    assert spent["time_full"] >= 0.05


def test_circle_packing_phases_add_up_to_wall_s(tmp_path):
    seed = Path(circle_packing.__file__).parent / "seed" / "packing.py"
    (tmp_path / "packing.py").write_text(seed.read_text())
    ev = evaluate_safely(
        circle_packing.CirclePacking(cpu_budget_s=2.0), tmp_path, EvalContext(timeout_s=60.0)
    )
    assert ev.ok, ev.artifacts
    spent = assert_adds_up(ev)
    assert {"time_sandbox_start", "time_program", "time_verify", "time_score"} <= set(spent)
    assert spent["time_program"] == max(spent.values())  # the candidate's own run dominates


def test_a_detail_is_told_of_the_phase_it_is_in_at_most_every_few_seconds(monkeypatch):
    heard: list[tuple[str, str]] = []
    phases.detail("step 1")  # no timeline: nothing to tell
    monkeypatch.setattr(phases, "DETAIL_EVERY_S", 1e9)  # every detail after the first is too soon
    with phases.reported(lambda phase, detail: heard.append((phase, detail))):
        with phases.timeline("harness"):
            phases.mark("training")
            phases.detail("step 1, loss 3.41")
            phases.detail("step 2, loss 3.40")  # throttled
            phases.mark("training", at=time.monotonic())  # a boundary learnt afterwards: no news
            phases.mark("scoring")  # a new phase: its first detail is told at once
            phases.detail("batch 1")
        monkeypatch.setattr(phases, "DETAIL_EVERY_S", 0.0)
        with phases.timeline("harness"):
            phases.detail("a")
            phases.detail("b")
    assert heard == [
        ("harness", ""),
        ("training", ""),
        ("training", "step 1, loss 3.41"),
        ("scoring", ""),
        ("scoring", "batch 1"),
        ("harness", ""),
        ("harness", "a"),
        ("harness", "b"),
    ]
