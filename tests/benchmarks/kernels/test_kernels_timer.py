"""The timer and the candidate's process, without the sandbox: arenas, batches, the unwritten-output check,
and upstream's CPU-runnable example solutions scored through the whole harness."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
from evolve.benchmarks.kernels import arena, timer
from evolve.benchmarks.kernels.spec import load_problem
from kernels_candidates import GOOD
from kernels_fixtures import tiny_rmsnorm

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = next((p for p in (ROOT.parent / "shared", ROOT.parent.parent / "shared")
                 if (p / "data" / "sol-execbench-examples").is_dir()), ROOT) / "data" / "sol-execbench-examples"  # fmt: skip


def test_a_layout_keeps_strides_and_puts_every_tensor_on_a_256_byte_boundary():
    layout = arena.Layout()
    first = layout.place((3, 5), torch.bfloat16)
    broadcast = layout.place((4, 6), torch.float32, (0, 1))  # an expand: one row of storage
    scalar = layout.place((), torch.float32)
    assert [p.offset % arena.ALIGNMENT_BYTES for p in (first, broadcast, scalar)] == [0, 0, 0]
    assert first.strides == (5, 1) and broadcast.strides == (0, 1) and scalar.shape == ()
    shared = arena.Arena(layout.nbytes, torch.device("cpu"))
    row = torch.arange(6, dtype=torch.float32)
    shared.view(arena.Placed(broadcast.offset, "float32", (6,), (1,))).copy_(row)
    assert torch.equal(shared.view(broadcast), row.expand(4, 6))
    # on a CPU each tensor has a storage of its own (Triton's interpreter copies whole storages)
    assert shared.view(first).untyped_storage().nbytes() == 15 * 2
    assert shared.view(first).data_ptr() == shared.base.data_ptr() + first.offset
    shared.close()


@pytest.fixture
def session(tmp_path, monkeypatch):
    """A candidate's process hosting the honest kernel, started by this test as the timer would."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    tiny_rmsnorm(tmp_path, rows=(33,))
    for name in ("work", "harness"):
        (tmp_path / name).mkdir()
    (tmp_path / "work" / "kernel.py").write_text(GOOD)
    started = timer.Session("cpu", cwd=tmp_path / "work")
    yield started
    started.close()


def job(tmp_path: Path, **settings: int) -> dict:
    return {"problem_dir": str(tmp_path / "tiny_rmsnorm"), "harness_dir": str(tmp_path / "harness"), "device": "cpu",
            "seed": 5, "rounds": 2, "warmup": 1, "iters": 7, "repeats": 2, "audits": 2, "batch": 3, "entry": None,
            "env": {}, **settings}  # fmt: skip


def test_every_batch_of_timed_calls_is_one_timing_measured_by_the_timer(session, tmp_path):
    result = timer.run_job(job(tmp_path), session)
    [workload] = result["workloads"]
    assert workload["status"] == "ok", workload
    assert len(workload["rounds"]) == 2 and workload["kernels"]  # the kernels, for feedback only
    assert [len(t) for t in workload["timings_ms"]] == [math.ceil(7 / 3)] * 2  # 3 + 3 + 1 calls a repeat
    assert all(v > 0 for t in workload["timings_ms"] for v in t)


def test_outputs_still_unwritten_when_the_candidate_says_done_are_found(session, tmp_path):
    problem = load_problem(tmp_path / "tiny_rmsnorm")
    measurer = timer.Measurer(session, job(tmp_path), problem, problem.workloads[0], object())
    made = measurer.maker.make(1)
    batch = timer.Batch([made, made, made], measurer.maker, torch.device("cpu"))
    samples = batch.samples(torch.Generator().manual_seed(0))
    assert batch.unwritten_now(samples) and batch.unwritten_calls(samples) == [0, 1, 2]  # all NaN
    for index in (0, 2):
        batch.outputs(index)[0].zero_()
    batch.outputs(1)[0][5:].zero_()  # call 1: five rows of 33 never written
    assert batch.unwritten_now(samples) and batch.unwritten_calls(samples) == [1]
    batch.outputs(1)[0].zero_()
    assert not batch.unwritten_now(samples)
    batch.close()


@pytest.mark.slow  # each example is a full evaluation under Triton's interpreter (up to ~1.5 min)
@pytest.mark.skipif(not EXAMPLES.is_dir(), reason="upstream's examples (shared/data/sol-execbench-examples) absent")
@pytest.mark.parametrize("language", ["pytorch", "triton"])
def test_upstreams_cpu_runnable_example_solutions_are_accepted(language):
    """Zero false rejections: upstream's own solutions pass every check and score above 0."""
    from evolve.benchmarks.kernels.cpu_check import score
    from evolve.benchmarks.kernels.harness import Settings

    os.environ["TRITON_INTERPRET"] = "1"
    settings = Settings(device="cpu", rounds=2, warmup=1, iters=4, audits=2, baseline="eager", timeout_s=600.0)
    for folder in sorted((EXAMPLES / language).iterdir()):
        status, value, _seconds = score(folder, next(folder.glob("solution*.json")), settings)
        assert status == "ok" and value > 0, (folder.name, status)
