"""The GPU seed through the real harness on a CUDA device (compile, bf16, scoring on GPU)."""

from pathlib import Path

import pytest
from evolve.benchmarks.nanochat import scales
from evolve.benchmarks.nanochat.fitness import NanochatFitness

from evolve.harness.fitness import EvalContext, evaluate_safely
from evolve.types import EvalStatus


@pytest.mark.gpu
def test_gpu_seed_trains_and_is_scored(data_dir: Path, tmp_path: Path):
    if not scales.cuda_available():
        pytest.skip("needs a CUDA GPU")
    work = tmp_path / "work"
    work.mkdir()
    for path in scales.SCALES["nanochat"].seed_dir.glob("*.py"):
        (work / path.name).write_text(path.read_text())
    fitness = NanochatFitness(
        scale="nanochat",
        data_dir=str(data_dir),
        dataset="tiny",
        vocab_size=512,
        seq_len=256,
        budget_s=10.0,
        eval_batch_rows=8,
        eval_tokens=256 * 8 * 3,
        # the full run alone (the quick stages have GPU tests of their own in tests/redteam):
        # with them, the seed's references and short run took the test past 160 s on the H200
        layered={"local_check": False, "short_run_steps": 0},
    )
    ev = evaluate_safely(fitness, work, EvalContext(seed=0, gpu="0", scratch=tmp_path))
    assert ev.status == EvalStatus.OK, dict(ev.artifacts)
    assert ev.metrics["steps"] > 11 and ev.metrics["reported_peak_mem_gb"] > 0
    assert ev.metrics["max_prefix_diff"] <= fitness.scale.causal_atol
    # the seed saves its initial checkpoint: the graph was exported from it while it trained
    assert ev.metrics["graph_from_initial"] == 1.0
