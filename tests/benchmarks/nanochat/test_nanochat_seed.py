"""The seed programs: same code at both scales, tweakable numbers only where tweaks stay valid."""

import random
from pathlib import Path

from evolve.benchmarks.nanochat import scales

from evolve.operators.builtin import literals, perturb
from evolve.operators.edits import block_bodies, blocks

GPU, CPU = scales.SCALES["nanochat"].seed_dir, scales.SCALES["cpu"].seed_dir


def outside_first_block(text: str) -> str:
    first = blocks(text)[0]
    return text[: first.start] + text[first.end :]


def test_both_scales_share_the_code():
    assert (
        {p.name for p in GPU.glob("*.py")}
        == {p.name for p in CPU.glob("*.py")}
        == {"train.py", "model.py"}
    )
    assert (GPU / "model.py").read_text() == (CPU / "model.py").read_text()
    gpu_rest = outside_first_block((GPU / "train.py").read_text())
    cpu_rest = outside_first_block((CPU / "train.py").read_text())
    assert [line for line in gpu_rest.splitlines() if line not in cpu_rest.splitlines()][:1] == [
        'if settings.device != "cuda":'
    ]


def test_numbers_live_in_the_hyperparameter_block():
    for seed in (GPU, CPU):
        train = block_bodies((seed / "train.py").read_text())
        assert len(train) == 2
        assert len(literals(train[0])) >= 12  # the hyperparameters
        assert literals(train[1]) == []  # optimizer and loss: code only
        (model_block,) = block_bodies((seed / "model.py").read_text())
        assert [lit.text for lit in literals(model_block)] == ["2"]  # residual-branch init scaling


def test_every_tweak_of_a_hyperparameter_gives_valid_python():
    rng = random.Random(0)
    text = (CPU / "train.py").read_text()
    body = block_bodies(text)[0]
    for lit in literals(body):
        for _ in range(5):
            new = perturb(lit.text, rng)
            compile(body[: lit.start] + new + body[lit.end :], "block", "exec")
            assert (float(new) > 0) == (float(lit.text) > 0)


def test_task_statement_exists():
    assert "val_bpb" in (Path(scales.HERE) / "TASK.md").read_text()
