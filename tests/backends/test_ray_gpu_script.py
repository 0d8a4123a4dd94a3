"""scripts/ray_gpu_run.py end to end: on CPU with a GPU Ray only believes in (slow), and on real GPUs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_script(out: Path, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "scripts/ray_gpu_run.py", "--out", str(out), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((out / "ray_gpu" / "ray_gpu.json").read_text())


@pytest.mark.slow
def test_the_gpu_script_passes_its_checks_on_cpu(tmp_path):
    pytest.importorskip("ray")
    result = run_script(tmp_path, "--cpu", "--smoke")
    assert all(result["checks"].values()) and result["gpus_used"] == ["0"]
    assert result["victim"] is not None


@pytest.mark.gpu
def test_the_gpu_script_passes_its_checks_on_the_gpus(tmp_path):
    pytest.importorskip("ray")
    result = run_script(tmp_path, "--smoke")
    assert all(result["checks"].values()) and all("NVIDIA" in d for d in result["devices"])
