"""hide_reads: the child cannot read hidden paths, yet renames across folders still work."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from evolve.harness.confine import hide_reads
from evolve.sandbox import landlock

pytestmark = pytest.mark.skipif(landlock.abi() < 2, reason="needs Landlock ABI >= 2 (refer)")

CHILD = """
import os, sys
work, secret = sys.argv[1], sys.argv[2]
os.makedirs(work + "/cache/tmp.1")
open(work + "/cache/tmp.1/f.so", "w").write("built")
os.replace(work + "/cache/tmp.1/f.so", work + "/cache/f.so")  # what Triton's cache does
print("moved", open(work + "/cache/f.so").read())
for what, act in [("read", lambda: open(secret).read()),
                  ("move", lambda: os.replace(secret, work + "/stolen"))]:
    try:
        act()
        print(what, "succeeded")
    except OSError as e:
        print(what, "refused", e.errno)
"""


def test_a_confined_child_renames_across_folders_but_never_reaches_hidden_files(tmp_path: Path):
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    secret = hidden / "val.bin"
    secret.write_text("validation")
    work = tmp_path / "work"
    work.mkdir()
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), str(work), str(secret)],
        preexec_fn=hide_reads([str(hidden)]),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "moved built" in out, out
    assert "read refused" in out and "move refused" in out, out
    assert secret.read_text() == "validation"
