"""Adopting a sandboxed command's orphans: their CPU time counts, and the caller keeps its own children."""

from __future__ import annotations

import ctypes
import resource
import subprocess
import sys

from evolve.harness import orphans

PR_GET_CHILD_SUBREAPER = 37
ORPHAN = """
import os, time
if os.fork() == 0:  # the grandchild: orphaned as its parent exits, then spins 0.3 CPU s
    start = time.process_time()
    while time.process_time() - start < 0.3:
        pass
    os._exit(0)
os._exit(0)
"""


def subreaper() -> bool:
    flag = ctypes.c_int(-1)
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0
    return bool(flag.value)


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def test_an_orphans_cpu_time_counts_and_adoption_ends_with_the_block() -> None:
    own = subprocess.Popen([sys.executable, "-c", "pass"])  # the caller's: never waited for here
    before = children_cpu_s()
    with orphans.adopted():
        assert subreaper()
        subprocess.run([sys.executable, "-c", ORPHAN], check=True)
    assert not subreaper()
    assert children_cpu_s() - before >= 0.3  # the grandchild's spin, reaped at the block's end
    assert own.wait() == 0  # its exit status was left to the code that started it
