"""The seed program: one for both scales, tweakable numbers only where tweaks stay valid."""

import random
from pathlib import Path

from evolve.benchmarks.nanochat import scales

from evolve.operators.builtin import literals, perturb
from evolve.operators.edits import block_bodies

SEED = scales.SCALES["nanochat"].seed_dir


def hyperparameters(gpu: bool) -> dict:
    namespace: dict = {"GPU": gpu}
    exec(block_bodies((SEED / "train.py").read_text())[0], namespace)
    return {k: v for k, v in namespace.items() if k.isupper() and k != "GPU"}


def test_one_program_serves_both_scales_with_its_own_sizes():
    assert scales.SCALES["cpu"].seed_dir == SEED
    assert {p.name for p in SEED.glob("*.py")} == {"train.py", "model.py"}
    gpu, cpu = hyperparameters(True), hyperparameters(False)
    sizes = ("N_LAYER", "N_HEAD", "N_EMBD", "DEVICE_BATCH", "GRAD_ACCUM", "WARMUP_STEPS")
    assert [gpu[k] for k in sizes] == [8, 8, 512, 64, 4, 20]
    assert [cpu[k] for k in sizes] == [2, 4, 128, 8, 1, 10]
    assert {k: v for k, v in gpu.items() if k not in sizes} == {
        k: v for k, v in cpu.items() if k not in sizes
    }
    assert 'GPU = settings.device == "cuda"' in (SEED / "train.py").read_text()


def test_numbers_live_in_the_hyperparameter_block():
    train = block_bodies((SEED / "train.py").read_text())
    assert len(train) == 2
    assert len(literals(train[0])) >= 12  # the hyperparameters
    assert literals(train[1]) == []  # optimizer and loss: code only
    (model_block,) = block_bodies((SEED / "model.py").read_text())
    assert [lit.text for lit in literals(model_block)] == ["2"]  # residual-branch init scaling


def test_every_tweak_of_a_hyperparameter_gives_valid_python():
    rng = random.Random(0)
    text = (SEED / "train.py").read_text()
    body = block_bodies(text)[0]
    for lit in literals(body):
        for _ in range(5):
            new = perturb(lit.text, rng)
            compile(body[: lit.start] + new + body[lit.end :], "block", "exec")
            assert (float(new) > 0) == (float(lit.text) > 0)


def test_task_statement_exists():
    assert "val_bpb" in (Path(scales.HERE) / "TASK.md").read_text()
