"""A program run bare (evolve.harness.bare): the stream's rules and timing, with rows from memory."""

import textwrap
from pathlib import Path

import numpy as np
import pytest

from evolve.harness.bare import ROWS_FILE, run_bare
from evolve.sandbox.isolation import Policy
from evolve.sandbox.process import Limits

PROGRAM = """
import time
from evolve.harness.stream import EndOfData, channel
c = channel()
seen = []
while True:
    try:
        batch = c.batch(2)
    except EndOfData:
        break
    seen.append(int(batch[0, 1]))
    time.sleep(0.01)
    if not c.step(tokens=8):
        break
try:
    c.batch(2)
    print("DATA AFTER THE STOP")
except EndOfData:
    pass
c.saved()
print("SEEN", seen[:5], len(seen), flush=True)
"""


@pytest.mark.parametrize("sandboxed", [False, True])
def test_a_bare_run_gets_synthetic_rows_then_the_rows_in_memory_until_the_budget(
    tmp_path: Path, sandboxed
):
    (tmp_path / "prog.py").write_text(textwrap.dedent(PROGRAM))
    rows = np.arange(7 * 5, dtype=np.int32).reshape(7, 5) + 1000  # real rows: values >= 1000
    sandbox = (Limits(), Policy()) if sandboxed else None
    result = run_bare(tmp_path, rows, entry="prog.py", env={}, budget_s=0.3, untimed_steps=3,
                      vocab=50, bos=0, timeout_s=120, sandbox=sandbox)  # fmt: skip
    assert result["returncode"] == 0, result["log_tail"]
    assert not (tmp_path / ROWS_FILE).exists()
    assert "DATA AFTER THE STOP" not in result["log_tail"]
    seen = eval(result["log_tail"].split("SEEN ")[1].split("]")[0] + "]")
    assert all(v < 50 for v in seen[:3])  # the untimed steps: synthetic tokens of the vocabulary
    assert seen[3:5] == [1001, 1011]  # then the rows in memory, in order, two a batch
    timed_batches = result["steps"] - 3
    assert result["tokens"] == timed_batches * 2 * 4  # real tokens handed out while timed
    assert result["training_s"] >= 0.3 and result["tokens_per_s"] > 0


def test_a_sandboxed_bare_run_is_inside_the_sandbox(tmp_path: Path):
    """The sandbox's share of the tax is measured in the sandbox: writes outside the program's
    folder are refused there."""
    program, outside = tmp_path / "program", tmp_path / "outside"
    program.mkdir()
    write = f"""
try:
    open({str(outside)!r}, "w").write("x")
    print("WROTE OUTSIDE")
except PermissionError:
    print("REFUSED")
"""
    (program / "prog.py").write_text(textwrap.dedent(PROGRAM) + write)
    rows = np.zeros((4, 5), dtype=np.int32)
    result = run_bare(program, rows, entry="prog.py", env={}, budget_s=0.1, untimed_steps=1,
                      vocab=50, bos=0, timeout_s=120, sandbox=(Limits(), Policy()))  # fmt: skip
    assert result["returncode"] == 0 and "REFUSED" in result["log_tail"], result["log_tail"]
    assert not outside.exists()
