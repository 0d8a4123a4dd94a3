"""The page cache an earlier evaluation left is gone before the auditor's strict re-evaluation."""

from __future__ import annotations

import ctypes
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from evolve.backends.base import run_job
from evolve.harness.fitness import EvalContext
from evolve.sandbox import identity, pagecache
from evolve.types import EvalStatus, Evaluation, Job, Objective

PAGES = 64
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p


def cached_pages(path: Path) -> int:
    """How many of the file's pages the page cache holds (mincore, from outside any sandbox)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        addr = libc.mmap(None, ctypes.c_size_t(size), mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        vec = (ctypes.c_ubyte * (size // mmap.PAGESIZE))()
        assert libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) == 0
        libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(size))
        return sum(v & 1 for v in vec)
    finally:
        os.close(fd)


def read_file(folder: Path) -> Path:
    """A file of PAGES pages, written to disk and read: every page cached (else skip)."""
    path = folder / "read.bin"
    path.write_bytes(os.urandom(PAGES * mmap.PAGESIZE))
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())
        handle.read()
    if cached_pages(path) != PAGES:
        pytest.skip("this file system does not keep a file it read in the page cache")
    return path


@dataclass(frozen=True)
class CachedPages:
    """A fitness that scores how many pages of ``path`` are cached when it starts."""

    path: str
    objective: Objective = Objective(name="score")
    descriptors: tuple = ()

    def evaluate(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        return Evaluation(status=EvalStatus.OK, fitness=float(cached_pages(Path(self.path))))


def test_forget_drops_what_earlier_reads_cached(tmp_path: Path) -> None:
    path = read_file(tmp_path)
    done = pagecache.forget()
    if done.startswith("NOT"):
        pytest.skip(f"the whole page cache cannot be dropped here: {done}")
    assert cached_pages(path) == 0, done


def test_without_drop_caches_the_given_folders_are_advised_out(tmp_path, monkeypatch) -> None:
    path = read_file(tmp_path)
    monkeypatch.setattr(pagecache, "DROP_CACHES", str(tmp_path / "no" / "drop_caches"))
    done = pagecache.forget([str(tmp_path)])
    assert done.startswith("NOT every file's") and "POSIX_FADV_DONTNEED" in done, done
    assert cached_pages(path) == 0, done


def test_only_a_strict_job_runs_after_the_drop_and_each_job_gets_a_fresh_uid(tmp_path) -> None:
    path = read_file(tmp_path)
    if pagecache.forget().startswith("NOT"):
        pytest.skip("the whole page cache cannot be dropped here")
    path.read_bytes()
    fitness = CachedPages(str(path))
    job = Job(candidate_id="c" * 16, files={}, seed=0, timeout_s=10)
    assert run_job(fitness, job, None).fitness == PAGES
    strict = Job(candidate_id="c" * 16, files={}, seed=0, timeout_s=10, strict=True)
    assert run_job(fitness, strict, None).fitness == 0
    before = identity.current()
    uids = {run_job(Uid(), job, None).fitness for _ in range(2)}
    assert len(uids) == 2 and before not in uids and identity.current() == before


@dataclass(frozen=True)
class Uid:
    """A fitness that scores the uid its sandboxed commands would run as."""

    objective: Objective = Objective(name="score")
    descriptors: tuple = ()

    def evaluate(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        return Evaluation(status=EvalStatus.OK, fitness=float(identity.current()))
