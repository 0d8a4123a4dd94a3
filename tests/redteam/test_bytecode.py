"""Planted bytecode: the compile cache's Python bytecode is written by the harness's warm-up
only; a candidate reads it and cannot replace what a harness process would run after it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from evolve.harness import bytecode
from evolve.sandbox.isolation import NOT
from evolve.sandbox.process import Limits, Policy, run

LIBRARY = (
    "evolve_bytecode_probe_library"  # stands for torch: a library a harness process imports too
)

CANDIDATE = f"""
import importlib.util, sys, {LIBRARY}
print("value", {LIBRARY}.VALUE, "writes", sys.flags.dont_write_bytecode == 0)
planted = importlib.util.cache_from_source({LIBRARY}.__file__)  # where Python reads its bytecode
try:
    open(planted, "wb").write(b"forged")
    print("planted", planted)
except OSError as exc:
    print("refused", exc.errno)
"""


def sandboxed(code: str, workdir: Path, env: dict, policy: Policy, *flags: str):
    workdir.mkdir()
    (workdir / "main.py").write_text(code)
    return run(
        [sys.executable, *flags, "main.py"],
        cwd=workdir,
        limits=Limits(timeout_s=60),
        env=env,
        policy=policy,
    )


def test_the_warm_up_writes_bytecode_that_later_sandboxes_read_and_cannot_replace(
    tmp_path: Path,
) -> None:
    library = tmp_path / "library"
    library.mkdir()
    (library / f"{LIBRARY}.py").write_text("VALUE = 'from the library'\n")
    cache = tmp_path / "compile-cache"
    # and a module the warm-up never imports
    (library / "evolve_bytecode_probe_later.py").write_text("")
    env = {"PYTHONPATH": str(library)}
    assert bytecode.readonly(cache, warming=True) == bytecode.readonly(None, warming=False) == ()

    # the harness's warm-up run: the whole cache writable, bytecode lands in its folder only
    warming = {**env, **bytecode.environment(cache, warming=True)}
    warm = sandboxed(f"import {LIBRARY}", tmp_path / "warm", warming, Policy(writable=[cache]))
    assert warm.ok, warm.tail()
    [compiled] = bytecode.folder(cache).rglob(f"{LIBRARY}.*.pyc")
    assert not list(library.rglob("*.pyc"))
    before, written = compiled.read_bytes(), sorted(bytecode.folder(cache).rglob("*"))

    # a candidate's run, under the benchmarks' policy: reads that bytecode, cannot replace it
    policy = Policy(shared_caches=[cache], readonly=bytecode.readonly(cache, warming=False))
    reading = {**env, **bytecode.environment(cache, warming=False)}
    code = CANDIDATE + "import evolve_bytecode_probe_later\n"  # compiled in memory, written nowhere
    candidate = sandboxed(code, tmp_path / "candidate", reading, policy, "-v")
    if candidate.isolation.get("readonly", NOT).startswith(NOT):
        # no mount namespace: the change is caught after the run instead
        assert str(compiled) in candidate.modified, candidate.tail()
        pytest.skip(f"no read-only bind mounts here: {candidate.isolation.get('readonly')}")
    assert candidate.ok, candidate.tail()
    assert "value from the library writes False" in candidate.stdout  # it does not even try
    # read from the cache, not compiled again
    assert f"code object from '{compiled}'" in candidate.stderr
    assert "refused" in candidate.stdout and "planted" not in candidate.stdout, candidate.stdout
    assert compiled.read_bytes() == before and candidate.modified == ()
    assert sorted(bytecode.folder(cache).rglob("*")) == written
