"""The sandbox's final sweep never mistakes another sandbox's processes for its own leftovers.

Namespace ids are inode numbers the kernel reuses as soon as a namespace dies, so the sweep
after a command exited must hold the command's namespace open (``_hold_namespace``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from evolve.sandbox.process import _hold_namespace


def namespace_of(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/mnt")


def fresh_namespaces(count: int) -> list[str]:
    ids = []
    for _ in range(count):
        proc = subprocess.Popen(["unshare", "-m", "sleep", "5"])
        time.sleep(0.02)
        try:
            ids.append(namespace_of(proc.pid))
        finally:
            proc.kill()
            proc.wait()
    return ids


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare(1)"
)
def test_a_held_namespace_id_is_not_handed_to_another_namespace():
    first = subprocess.Popen(["unshare", "-m", "sleep", "30"])
    time.sleep(0.05)
    ns = namespace_of(first.pid)
    fd = _hold_namespace(first.pid, ns)
    assert fd is not None
    first.kill()
    first.wait()
    try:
        assert ns not in fresh_namespaces(10)  # while held, the id stays taken
    finally:
        os.close(fd)
    assert _hold_namespace(first.pid, ns) is None  # the command is gone: nothing to hold
