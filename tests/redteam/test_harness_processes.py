"""Harness processes that run in a candidate's folder never run the candidate's code.

A benchmark's harness processes (supervisor, scorer, probe, driver) are started in the sandbox
as ``python *SAFE_PATH -m MODULE``, often in the candidate's own folder, where HOME is the
candidate's (``.sandbox/home``, writable by it, and a path its files may take).
"""

from __future__ import annotations

import sys

import pytest

from evolve.harness.protocol import SAFE_PATH
from evolve.sandbox.process import Limits, run


@pytest.mark.parametrize("python", sorted({sys.executable, sys._base_executable}))
def test_a_usercustomize_in_the_candidates_home_never_runs_in_a_harness_process(python, tmp_path):
    # an interpreter outside a venv (or in one with system site-packages) enables Python's user
    # site: $HOME/.local/lib/pythonX.Y/site-packages, whose usercustomize it imports at start-up
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = tmp_path / ".sandbox" / "home" / ".local" / "lib" / version / "site-packages"
    site.mkdir(parents=True)
    (site / "usercustomize.py").write_text("print('the candidate ran in the harness process')\n")
    code = "print('the harness ran')"
    result = run([python, *SAFE_PATH, "-c", code], cwd=tmp_path, limits=Limits(timeout_s=30))
    assert result.stdout.split("\n")[0] == "the harness ran", result.tail()
