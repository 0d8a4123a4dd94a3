"""scripts/fixed_steps.py and scripts/old_tree.py: two commits' seeds at the same steps, on CPU."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OLD = "d648b9c"  # the commit before the harness layer (issue 30)


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def has_commit(commit: str) -> bool:
    done = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=REPO, capture_output=True)  # fmt: skip
    return done.returncode == 0


def test_the_old_tree_is_laid_out_as_the_installed_package(tmp_path):
    if not has_commit(OLD):
        pytest.skip(f"this clone lacks {OLD}")
    folder = script("old_tree").export(OLD, tmp_path)
    assert (folder / "evolve" / "benchmarks" / "nanochat" / "seed" / "train.py").is_file()
    assert (folder / "evolve" / "benchmarks" / "speedrun" / "seed" / "train.py").is_file()
    assert not list(folder.rglob("results")) and not list(folder.rglob("*.md"))
    code = "import evolve.benchmarks.nanochat.client as c; print(c.__file__)"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(folder), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert done.stdout.strip().startswith(str(folder)), done.stderr


def test_shrunk_sets_both_seeds_sizes_and_drops_the_gpu_only_exit():
    fixed_steps = script("fixed_steps")
    head = (REPO / "benchmarks/nanochat/seed/train.py").read_text()
    assert "N_LAYER = 2\n" in fixed_steps.shrunk(head, {"N_LAYER": 2})
    old = 'N_LAYER = 8\nif settings.device != "cuda":\n    raise SystemExit(\n        "GPU only"\n    )\nrest\n'
    assert fixed_steps.shrunk(old, {"N_LAYER": 2}) == "N_LAYER = 2\nrest\n"
    with pytest.raises(ValueError, match="'NOT_THERE = ...'"):
        fixed_steps.shrunk(head, {"NOT_THERE": 1})


def run_fixed_steps(tmp_path: Path, old_tree: Path, *args: str) -> dict:
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "scripts/fixed_steps.py", *args, "--device", "cpu", "--old-tree", str(old_tree),
         "--data-root", str(tmp_path / "data"), "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((out / f"fixed-steps-{args[0]}.json").read_text())


@pytest.mark.slow
def test_the_seeds_of_both_commits_train_alike_step_for_step_on_cpu(tmp_path):
    """The finding of issue 30 on CPU: without untimed steps the two commits' nanochat and
    speedrun seeds give the same loss at every step and the same validation loss; with
    nanochat's untimed steps the newer harness feeds synthetic rows there (no loss compared)."""
    if not has_commit(OLD):
        pytest.skip(f"this clone lacks {OLD}")
    old_tree = script("old_tree").export(OLD, tmp_path / "old")
    nanochat = run_fixed_steps(tmp_path, old_tree, "nanochat", "--steps", "12", "--untimed", "0")
    pair = nanochat["pairs"][0]
    assert pair["identical_steps"] == pair["compared_steps"] == 12 and pair["val_difference"] == 0.0
    speedrun = run_fixed_steps(tmp_path, old_tree, "speedrun", "--steps", "12")
    pair = speedrun["pairs"][0]
    assert pair["identical_steps"] == pair["compared_steps"] == 12 and pair["val_difference"] == 0.0
    untimed = run_fixed_steps(tmp_path, old_tree, "nanochat", "--steps", "12", "--untimed", "3")
    old, head = (run["losses"] for run in untimed["runs"])
    assert None not in old and head[:3] == [None] * 3 and None not in head[3:]
