"""Red team, the CPU scales (nanochat ``cpu``, speedrun ``cpu``): training after the stop, and validation text rebuilt.

Two cheats that only the CPU scales allowed (issue 29, items 3 and 4). Training between the
harness's stop and the checkpoint report: the report must come within what the step in flight
and the write need (``evolve.harness.savetime``), measured by the harness; the slow tests run
it through the real fitness at the CPU scale's default settings. Rebuilding the validation
rows: the CPU scales' validation text is the standard library's test package, which the
sandbox hides; a program that reads it is rejected (nanochat's guard) or finds nothing (native
code, and speedrun, which has no guard) and gains nothing.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from evolve.benchmarks.nanochat import prepare
from evolve.benchmarks.nanochat.fitness import NanochatFitness
from evolve.benchmarks.nanochat.sources import chunk_text
from evolve.benchmarks.speedrun.data import DataSpec, ensure_stdlib_shards
from evolve.benchmarks.speedrun.fitness import SEED_PROGRAM

from evolve.harness.documents import stdlib_tests
from evolve.harness.fitness import EvalContext, evaluate_safely
from evolve.sandbox import landlock
from evolve.types import EvalStatus
from tests.fixtures.nanochat_tiny import tiny_fitness
from tests.fixtures.speedrun_cpu import cpu_fitness
from tests.redteam import nanochat_programs as programs
from tests.redteam.helpers import assert_caught

SAVE = 'client.save_checkpoint(model, config, code_files=["model.py"])\n'
STEP = "    if not clock.step(tokens=len(micro) * x.numel(), loss=loss.item()):\n"
KEEP = "    for x, y in micro:\n"
# the rows of the last steps kept, to train on after the stop (no more come from the harness)
KEPT = KEEP + "        _kept.append((x, y))\n        del _kept[:-8]\n"
MORE = (  # five seconds of training on the kept rows (the cheat had ten)
    "{indent}_until = time.monotonic() + 5.0\n"
    "{indent}while time.monotonic() < _until:\n"
    "{indent}    for _x, _y in _kept:\n"
    "{indent}        loss_of(model, _x, _y).backward()\n"
    "{indent}        optimizer.step()\n"
    "{indent}        optimizer.zero_grad(set_to_none=True)\n"
)
GAP_CHEATS = {
    # the loop ends at the stop as asked, then trains on before saving
    "after_the_last_step": (SAVE, MORE.format(indent="") + SAVE),
    # the step in flight at the stop (by the program's own estimate) trains on before it reports
    "inside_the_step_in_flight": (
        STEP,
        "    if clock.progress >= 1.0:\n" + MORE.format(indent="        ") + STEP,
    ),
}


def gap_cheat(name: str) -> dict[str, str]:
    files = programs.seed_files()
    train = (
        files["train.py"]
        .replace(KEEP, KEPT)
        .replace("batches = client", "_kept = []\nbatches = client")
    )
    anchor, code = GAP_CHEATS[name]
    assert anchor in train
    files["train.py"] = train.replace(anchor, code)
    return files


@pytest.fixture(scope="module")
def cpu_scale() -> NanochatFitness:
    """nanochat at the CPU scale's default settings, on its default data folder (built on first use)."""
    return NanochatFitness(scale="cpu")


@pytest.mark.slow  # the CPU scale's 15 s budget, twice, plus its dataset on first use
@pytest.mark.parametrize("cheat", sorted(GAP_CHEATS))
def test_training_between_the_stop_and_the_checkpoint_is_rejected_at_the_cpu_scale(
    cpu_scale, tmp_path, cheat
):
    work = programs.write(gap_cheat(cheat), tmp_path / "work")
    ev = evaluate_safely(cpu_scale, work, EvalContext(seed=0, scratch=tmp_path))
    assert_caught(
        ev, EvalStatus.REJECTED, r"reported a checkpoint \d+\.\d+s after the stop.*floor of 0\.5s"
    )


@pytest.mark.slow
def test_the_cpu_seed_saves_within_its_allowance_which_leaves_no_time_to_train(cpu_scale, tmp_path):
    work = programs.write(programs.seed_files(), tmp_path / "work")
    ev = evaluate_safely(cpu_scale, work, EvalContext(seed=0, scratch=tmp_path))
    assert ev.ok, dict(ev.artifacts)
    # at most the floor and a step as long as it: a fifteenth of the 15 s budget, where the
    # fixed 10 s it replaces let a program train two thirds as long again
    assert (
        ev.metrics["stop_to_save_s"]
        < ev.metrics["save_allowed_s"]
        <= 2 * cpu_scale.scale.save_floor_s
    )


def test_a_gap_cheat_is_rejected_at_the_tiny_scale(tmp_path, tiny_data):
    work = programs.write(gap_cheat("after_the_last_step"), tmp_path / "work")
    ev = evaluate_safely(tiny_fitness(tiny_data), work, EvalContext(seed=0, scratch=tmp_path))
    assert_caught(ev, EvalStatus.REJECTED, r"reported a checkpoint \d+\.\d+s after the stop")


# --- validation text rebuilt from the standard library -------------------------------------------

REBUILD = """
import ctypes as _c, pathlib as _p, sysconfig as _s
_tests = _p.Path(_s.get_paths()["stdlib"]) / "test"
print("NATIVE_FD", _c.CDLL(None).open(str(_tests / "__init__.py").encode(), 0), flush=True)
try:
    _found = sorted(_tests.rglob("*.py"))
    print("REBUILT", sum(len(p.read_text()) for p in _found), "chars from", len(_found), "files", flush=True)
except OSError as _error:
    print("REBUILD FAILED", _error, flush=True)
"""


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> Path:
    """A tiny dataset whose validation text is recorded as coming from the test package, as the
    CPU scale's stdlib set records it (``prepare.ensure_stdlib``)."""
    root = tmp_path_factory.mktemp("cpu-scales")
    texts = chunk_text((Path(__file__).parents[2] / "README.md").read_text()[:60_000])
    prepare.build(root / "tiny", train=lambda: texts, val=lambda: texts, vocab_size=512,
                  describe={"hidden_sources": [str(stdlib_tests())]}, log=lambda _: None)  # fmt: skip
    return root


def test_the_stdlib_sets_record_the_test_package_as_hidden(tmp_path, monkeypatch):
    # nanochat: the automatic stdlib set (its corpus made small here) hides its validation source
    monkeypatch.setattr(
        prepare.sources, "stdlib_corpus", lambda: (["a b c\n" * 50] * 20, ["d e\n" * 50] * 5)
    )
    root = prepare.ensure_stdlib(tmp_path / prepare.stdlib_name(300), 300, log=lambda _: None)
    assert prepare.hidden_sources(root) == [str(stdlib_tests())]
    assert json.loads((root / "dataset.json").read_text())["source"] == "python-stdlib"


def test_nanochat_program_reading_the_validation_source_is_rejected(tiny_data, tmp_path):
    files = programs.seed_files()
    anchor = "torch.manual_seed(settings.seed)\n"
    files["train.py"] = files["train.py"].replace(anchor, anchor + REBUILD)
    work = programs.write(files, tmp_path / "work")
    fitness = tiny_fitness(tiny_data)
    assert str(stdlib_tests()) in fitness.forbidden()
    ev = evaluate_safely(fitness, work, EvalContext(seed=0, scratch=tmp_path))
    assert_caught(ev, EvalStatus.REJECTED, r"read forbidden data.*test")
    if landlock.abi() >= 1:  # native code, past the guard, finds the files unreadable too
        assert "NATIVE_FD -1" in ev.artifacts["train_log"], ev.artifacts["train_log"]


def test_speedrun_program_rebuilding_the_validation_text_finds_nothing(tmp_path):
    data_dir = ensure_stdlib_shards(tmp_path / "stdlib")
    assert stdlib_tests() in DataSpec(data_dir=str(data_dir)).hidden()
    seed = (SEED_PROGRAM / "train.py").read_text()
    anchor = '        print(f"trained_tokens='  # rank 0, after the stop: the output's last lines
    assert anchor in seed
    rebuild = textwrap.indent(REBUILD.strip("\n") + "\n", "        ")
    folder = tmp_path / "candidate"
    folder.mkdir()
    (folder / "train.py").write_text(seed.replace(anchor, rebuild + anchor, 1))
    fitness = cpu_fitness(str(data_dir), overrides={"steps": 20, "warmup_steps": 2})
    ev = evaluate_safely(fitness, folder, EvalContext(seed=0, scratch=tmp_path / "scratch"))
    output = ev.artifacts.get("output", "")
    assert ev.ok, dict(ev.artifacts)
    assert "REBUILT 0 chars from 0 files" in output or "REBUILD FAILED" in output, output
    if landlock.abi() >= 1:
        assert "NATIVE_FD -1" in output, output
