"""What every evaluation backend shares: the job, the backend protocol, and running one job."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import platform
import shutil
import tempfile
from pathlib import Path
from typing import Protocol

from evolve.harness.fitness import EvalContext, Fitness, evaluate_safely, write_files
from evolve.sandbox import identity, pagecache
from evolve.types import Evaluation, InfrastructureFault, Job

log = logging.getLogger(__name__)
HARNESS_GRACE_S = 60.0  # how long past the candidate's timeout a fitness may take to return


class Backend(Protocol):
    """Runs evaluations; ``slots`` of them at once."""

    slots: int

    async def evaluate(self, slot: int, job: Job) -> Evaluation: ...

    def close(self) -> None: ...


@functools.cache
def hardware(gpu: str | None) -> str:
    """A short description of the hardware an evaluation runs on (``gpu``: CUDA_VISIBLE_DEVICES)."""
    if gpu is None:
        return f"cpu: {platform.processor() or platform.machine()} x{os.cpu_count()}"
    try:
        import torch

        return f"gpu {gpu}: {torch.cuda.get_device_name(0)}"
    except Exception:
        return f"gpu {gpu}"


def run_job(fitness: Fitness, job: Job, gpu: str | None) -> Evaluation:
    """Evaluate ``job`` with ``fitness`` in this process: fresh workdir and scratch, both removed
    after; its sandboxed commands run as a fresh uid (``evolve.sandbox.identity``), and a strict job
    (the auditor's) after the page cache was dropped (``evolve.sandbox.pagecache``).

    Args:
        fitness: the benchmark's fitness.
        job: the candidate's files, seed and timeout.
        gpu: the CUDA_VISIBLE_DEVICES value this process owns, or None on CPU.

    Returns:
        The evaluation; a fitness that raises gives an ERROR evaluation (``evaluate_safely``).

    Raises:
        InfrastructureFault: the machine failed the evaluation (its folders, a full disk).
    """
    if job.strict:  # nothing an earlier evaluation left in the page cache reaches this one
        log.info("strict evaluation of %s: %s", job.candidate_id[:8], pagecache.forget())
    made: list[Path] = []
    try:
        try:
            made.append(Path(tempfile.mkdtemp(prefix=f"evolve-{job.candidate_id[:8]}-")))
            made.append(Path(tempfile.mkdtemp(prefix="evolve-harness-")))
            write_files(job.files, made[0])
        except OSError as exc:  # the machine's fault, not the candidate's
            raise InfrastructureFault(
                f"cannot prepare an evaluation's folders in {tempfile.gettempdir()} ({exc}); free "
                "space there, or point TMPDIR at a writable disk, and resume the run: the "
                "candidate is evaluated again"
            ) from exc
        workdir, scratch = made
        ctx = EvalContext(
            seed=job.seed,
            timeout_s=job.timeout_s,
            gpu=gpu,
            hardware=hardware(gpu),
            scratch=scratch,
            strict=job.strict,
        )
        with identity.fresh():  # its sandboxed commands run as a uid of its own
            return evaluate_safely(fitness, workdir, ctx)
    finally:
        for path in made:
            remove_tree(path)


def remove_tree(path: Path) -> None:
    """Remove ``path`` and all beneath it, folders the candidate made read-only included.

    Without root's override of file permissions, a file in a folder of mode 0o555 cannot be
    unlinked: a plain ``rmtree`` would leave it in the host's /tmp, where the next candidate
    reads it. Every folder is made writable first (the candidate's processes are all gone).
    """
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)
    for folder, subfolders, _ in os.walk(path):  # top-down: a folder is listed after its chmod
        for name in subfolders:
            target = os.path.join(folder, name)
            if not os.path.islink(target):
                with contextlib.suppress(OSError):
                    os.chmod(target, 0o700)
    shutil.rmtree(path, ignore_errors=True)
