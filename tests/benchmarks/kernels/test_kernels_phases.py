"""A kernel evaluation's time by phase (``time_<phase>`` metrics) and its roofline feedback, through the real fitness."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from evolve.benchmarks.kernels.fitness import KernelFitness
from kernels_candidates import CALIBRATION, GOOD
from kernels_fixtures import tiny_rmsnorm

from evolve.harness.fitness import EvalContext, evaluate_safely


@pytest.fixture
def fitness(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    tiny_rmsnorm(tmp_path / "data", rows=(8, 33))
    calibration = tmp_path / "calibration.json"
    calibration.write_text(json.dumps(CALIBRATION))
    return KernelFitness(problem="tiny_rmsnorm", dataset=str(tmp_path / "data"), device="cpu", rounds=2, warmup=1,
                         iters=4, audits=1, baseline="eager", calibration=str(calibration))  # fmt: skip


def test_time_phases_add_up_to_the_wall_time_and_the_baseline_is_measured_once(
    fitness, tmp_path, monkeypatch
):
    from evolve.benchmarks.kernels import harness

    tasks = []
    real = harness.referee_call

    def counted(job, settings, env):
        tasks.append(job["task"])
        return real(job, settings, env)

    monkeypatch.setattr(harness, "referee_call", counted)
    evaluations = []
    for name in ("first", "second"):
        workdir = tmp_path / name
        workdir.mkdir()
        (workdir / "kernel.py").write_text(GOOD)
        evaluations.append(evaluate_safely(fitness, workdir, EvalContext(seed=1, timeout_s=120)))
    for ev in evaluations:
        assert ev.ok, dict(ev.artifacts)
        phases = {k: v for k, v in ev.metrics.items() if k.startswith("time_")}
        assert sum(phases.values()) == pytest.approx(ev.wall_s, rel=0.02)
        assert all(v >= 0 for v in phases.values())
        for phase in ("process_start", "candidate_import", "correctness", "timing", "process_exit", "scoring"):
            assert phases[f"time_{phase}"] > 0, phase
    assert tasks == ["baseline"]  # kept by the harness for the second evaluation; no witness task


def test_the_roofline_feedback_reaches_the_childs_prompt_whole(fitness, tmp_path):
    from evolve.harness.fitness import Benchmark
    from evolve.operators.prompting import Budget, context_values, messages_for, program_view
    from evolve.types import Candidate, Parent

    workdir = tmp_path / "parent"
    workdir.mkdir()
    (workdir / "kernel.py").write_text(GOOD)
    ev = evaluate_safely(fitness, workdir, EvalContext(seed=1, timeout_s=120))
    assert ev.ok, dict(ev.artifacts)
    roofline = ev.artifacts["roofline"]
    assert (
        roofline.count("memory-bound: T_k") == 2
        and "% of peak" in roofline
        and "T_b's speed" in roofline
    )
    assert "kernels per call:" in roofline and ev.metrics["time_feedback"] >= 0
    benchmark = Benchmark(
        name="kernels", fitness=fitness, seed_dir=tmp_path, editable=("kernel.py",)
    )
    parent = Parent(
        candidate=Candidate(id="p" * 12, seq=1, files={"kernel.py": GOOD}, operator="seed"),
        evaluation=ev,
    )
    budget = Budget()  # llm.artifact_chars's default, shared by all the parent's artifacts
    values = context_values(benchmark, parent, [], [], budget)
    values["program"] = program_view(parent, benchmark, budget, label="Program")
    assert dict(values["program"]["artifacts"])["roofline"] == roofline.strip()
    prompt = messages_for("diff.md.j2", values)[-1]["content"]
    assert all(line in prompt for line in roofline.splitlines())


def test_a_candidate_failing_at_import_leaves_no_timer_nor_folder(fitness, tmp_path, monkeypatch):
    from evolve.benchmarks.kernels import harness

    taken = []
    real = harness.take_timer

    def recorded(device, timeout_s, env):
        taken.append(real(device, timeout_s, env))
        return taken[-1]

    monkeypatch.setattr(harness, "take_timer", recorded)
    workdir = tmp_path / "broken"
    workdir.mkdir()
    (workdir / "kernel.py").write_text("raise RuntimeError('no kernel here')\n")
    ev = evaluate_safely(fitness, workdir, EvalContext(seed=1, timeout_s=120))
    assert not ev.ok and "importing the candidate: RuntimeError: no kernel here" in str(dict(ev.artifacts))
    assert len(taken) == 1
    for timer in taken:  # its sandbox (the candidate's process with it) ended, its folder removed
        assert not timer.started.alive() and timer.started.proc.returncode is not None
        assert not timer.folder.exists()


def test_timers_started_ahead_wait_per_key_and_the_oldest_give_way(fitness, monkeypatch):
    from evolve.benchmarks.kernels import process

    monkeypatch.setattr(process, "AHEAD", 2)
    monkeypatch.setattr(process, "MAX_WAITING_TIMERS", 3)
    monkeypatch.setattr(process, "_WAITING", [])
    device, timeout = fitness.settings.device, fitness.settings.timeout_s
    envs = [{"CUDA_VISIBLE_DEVICES": str(gpu), "EVOLVE_SEED": "7"} for gpu in range(2)]
    keys = [process.timer_key(device, timeout, env) for env in envs]
    process.prepare_next_timer(device, timeout, envs[0])
    assert [k for k, _ in process._WAITING] == [keys[0], keys[0]]  # two ahead for GPU 0
    oldest, second = (timer for _, timer in process._WAITING)
    process.prepare_next_timer(device, timeout, envs[1])
    # three may wait in all: GPU 0's oldest gave way to GPU 1's two
    assert [k for k, _ in process._WAITING] == [keys[0], keys[1], keys[1]]
    assert not oldest.started.alive() and not oldest.folder.exists()
    # the next evaluation on GPU 0 (any seed) takes the timer started for it; the top-up
    # starts two for GPU 0, and GPU 1's oldest gives way
    taken = process.take_timer(device, timeout, {**envs[0], "EVOLVE_SEED": "8"})
    assert taken is second and taken.started.alive()
    process.prepare_next_timer(device, timeout, envs[0])
    assert [k for k, _ in process._WAITING] == [keys[1], keys[0], keys[0]]
    for timer in [taken, *(t for _, t in process._WAITING)]:
        timer.close()
        assert not timer.started.alive() and not timer.folder.exists()


def test_timers_still_waiting_when_the_process_exits_end_and_leave_no_folder():
    script = (
        "from evolve.benchmarks.kernels import process\n"
        "process.prepare_next_timer('cpu', 60.0, {})\n"
        "print(json.dumps([[d.started.proc.pid, str(d.folder)] for _, d in process._WAITING]))\n"
    )
    done = subprocess.run([sys.executable, "-c", "import json\n" + script], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "TRITON_INTERPRET": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    waiting = json.loads(done.stdout.splitlines()[-1])
    assert len(waiting) == 2
    for pid, folder in waiting:
        assert not Path(folder).exists()
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
