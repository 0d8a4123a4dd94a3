"""The compile cache's Python bytecode: the harness's warm-up writes it, later sandboxes read it and cannot change it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from evolve.harness import bytecode
from evolve.isolation import NOT
from evolve.sandbox import Limits, Policy, run

LIBRARY = (
    "evolve_bytecode_probe_library"  # stands for torch: a library a harness process imports too
)

CANDIDATE = f"""
import importlib.util, {LIBRARY}
print("value", {LIBRARY}.VALUE)
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
    env = {**bytecode.environment(cache), "PYTHONPATH": str(library)}
    assert (
        bytecode.readonly(cache, warming=True) == ()
        and bytecode.readonly(None, warming=False) == ()
    )

    # the harness's warm-up run: the whole cache writable, bytecode lands in its folder only
    warm = sandboxed(f"import {LIBRARY}", tmp_path / "warm", env, Policy(writable=[cache]))
    assert warm.ok, warm.tail()
    [compiled] = bytecode.folder(cache).rglob(f"{LIBRARY}.*.pyc")
    assert not list(library.rglob("*.pyc"))
    before = compiled.read_bytes()

    # a candidate's run, under the benchmarks' policy: reads that bytecode, cannot replace it
    policy = Policy(shared_caches=[cache], readonly=bytecode.readonly(cache, warming=False))
    candidate = sandboxed(CANDIDATE, tmp_path / "candidate", env, policy, "-v")
    if candidate.isolation.get("readonly", NOT).startswith(NOT):
        assert str(compiled) in candidate.modified, (
            candidate.tail()
        )  # checked after the run instead
        pytest.skip(
            f"read-only bind mounts unavailable here: {candidate.isolation.get('readonly')}"
        )
    assert candidate.ok, candidate.tail()
    assert "value from the library" in candidate.stdout
    assert (
        f"code object from '{compiled}'" in candidate.stderr
    )  # read from the cache, not compiled again
    assert "refused" in candidate.stdout and "planted" not in candidate.stdout, candidate.stdout
    assert compiled.read_bytes() == before and candidate.modified == ()
