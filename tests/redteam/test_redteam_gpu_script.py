"""The GPU red-team script runs end to end on CPU (tiny problem, Triton's interpreter)."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.slow  # ~90 s on 2 cores: nine kernel evaluations with baseline measurement
def test_redteam_gpu_script_on_cpu(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "scripts/redteam_gpu.py", "--device", "cpu", "--tiny"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads((tmp_path / "redteam_gpu.json").read_text())["rows"]
    verdicts = {r["candidate"]: r["verdict"] for r in rows}
    assert verdicts["honest (seed 1)"] == verdicts["honest (seed 2)"] == "passed"
    assert verdicts["patched CUDA events"] == verdicts["lazy output tensor"] == "caught"
