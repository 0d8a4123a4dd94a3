"""The shared compile cache: the harness's warm-up writes it in place; a run reads it and what it writes vanishes."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from evolve.harness import bytecode, compile_cache
from evolve.sandbox import Limits, Policy, isolation_report, run
from evolve.sandbox.isolation import NOT

WRITES = """
import os, pathlib
kernels = pathlib.Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
print("read", (kernels / "kernel.so").read_text() if (kernels / "kernel.so").exists() else "nothing")
(kernels / "kernel.so").write_text("poisoned")
(pathlib.Path(os.environ["TRITON_CACHE_DIR"]) / "planted").write_text("x")
print("wrote")
"""


def in_sandbox(workdir: Path, cache: Path, warming: bool):
    """WRITES run in the sandbox with the cache as a run (or the warm-up) gets it."""
    workdir.mkdir(exist_ok=True)
    (workdir / "main.py").write_text(textwrap.dedent(WRITES))
    access = compile_cache.access(cache, warming)
    policy = Policy(
        writable=access.writable, shared_caches=access.shared_caches, readonly=access.readonly
    )
    env = compile_cache.environment(cache, warming)
    return run(
        [sys.executable, "main.py"],
        cwd=workdir,
        env=env,
        policy=policy,
        limits=Limits(timeout_s=120),
    )


def test_the_warm_up_writes_the_cache_and_a_run_reads_it_without_leaving_anything(tmp_path):
    cache = tmp_path / "cache"
    access = compile_cache.access(cache, warming=False)
    if (
        isolation_report(Policy(shared_caches=access.shared_caches))
        .get("shared_caches", "")
        .startswith(NOT)
    ):
        pytest.skip("no mount namespace: the cache is only read-only to runs (Landlock)")
    warm = in_sandbox(tmp_path / "warm", cache, warming=True)
    assert warm.returncode == 0 and warm.stdout.split() == ["read", "nothing", "wrote"], warm.tail()
    (cache / "inductor" / "kernel.so").write_text("compiled")  # as the seed's compilation would
    (cache / "triton" / "planted").unlink()
    before = sorted(p.relative_to(cache) for p in cache.rglob("*"))
    for i in range(2):  # the second run sees the cache as the first found it
        ran = in_sandbox(tmp_path / f"run{i}", cache, warming=False)
        assert ran.returncode == 0 and ran.stdout.split() == ["read", "compiled", "wrote"], (
            ran.tail()
        )
    assert (cache / "inductor" / "kernel.so").read_text() == "compiled"
    assert sorted(p.relative_to(cache) for p in cache.rglob("*")) == before


def test_a_run_gets_the_cache_shared_and_its_bytecode_read_only_and_no_cache_nothing(tmp_path):
    cache = tmp_path / "cache"
    shared = compile_cache.access(cache, warming=False)
    assert shared == compile_cache.Access(
        shared_caches=(str(cache),), readonly=(str(cache / bytecode.FOLDER),)
    )
    assert compile_cache.access(cache, warming=True) == compile_cache.Access(writable=(str(cache),))
    assert compile_cache.access(None, warming=False) == compile_cache.Access()
    env = compile_cache.environment(cache, warming=False)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(cache / "inductor")
    assert env["TRITON_CACHE_DIR"] == str(cache / "triton")
    assert env[bytecode.NO_WRITES_ENV] == "1"  # only the warm-up writes bytecode
    assert bytecode.NO_WRITES_ENV not in compile_cache.environment(cache, warming=True)
