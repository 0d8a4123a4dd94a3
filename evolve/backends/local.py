"""The local evaluation backend: worker processes on this machine, one per slot.

The local backend keeps one single-process pool per slot. A slot on a GPU machine owns
``gpus_per_eval`` GPUs through CUDA_VISIBLE_DEVICES, set before the worker imports
anything. The driver never runs a fitness itself: a fitness that hangs past its outer
deadline, or kills its worker, is recorded as a failed evaluation and the slot's worker is
replaced.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from evolve.backends.base import HARNESS_GRACE_S, Job, run_job
from evolve.fitness import Fitness
from evolve.types import EvalStatus, Evaluation


def visible_gpus() -> list[str]:
    """GPU ids this process may use (CUDA_VISIBLE_DEVICES, else all that torch sees)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g for g in listed.split(",") if g.strip()]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # no torch, or a broken CUDA: evaluate on CPU
        return []


def gpu_groups(gpus_per_eval: int, workers: int | None) -> list[str | None]:
    """The CUDA_VISIBLE_DEVICES value of each slot; None entries are CPU slots."""
    if gpus_per_eval <= 0:
        return [None] * (workers or max(1, os.cpu_count() or 1))
    gpus = visible_gpus()
    groups = [
        ",".join(gpus[i : i + gpus_per_eval])
        for i in range(0, len(gpus) - gpus_per_eval + 1, gpus_per_eval)
    ]
    if not groups:
        raise RuntimeError(
            f"this benchmark needs {gpus_per_eval} GPU(s) per evaluation but none are visible; "
            "run it on a machine with a CUDA GPU or choose a CPU scale of the benchmark"
        )
    return groups[:workers] if workers else groups


# --- worker side ---------------------------------------------------------------------------------

_worker_fitness: Fitness | None = None
_worker_gpu: str | None = None


def _init_worker(fitness: Fitness, gpu: str | None) -> None:
    global _worker_fitness, _worker_gpu
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    _worker_fitness, _worker_gpu = fitness, gpu


def _run_job(job: Job) -> Evaluation:
    assert _worker_fitness is not None, "worker not initialised"
    return run_job(_worker_fitness, job, _worker_gpu)


# --- driver side ---------------------------------------------------------------------------------


class LocalBackend:
    """Evaluates on this machine, one worker process per slot.

    Args:
        fitness: the benchmark's fitness (pickled once into each worker).
        gpus_per_eval: GPUs each evaluation needs (0 = CPU).
        workers: number of slots; None = one per GPU group, or one per CPU core.
    """

    def __init__(
        self, *, fitness: Fitness, gpus_per_eval: int = 0, workers: int | None = None
    ) -> None:
        self.fitness = fitness
        self.groups = gpu_groups(gpus_per_eval, workers)
        self.slots = len(self.groups)
        self._context = multiprocessing.get_context("spawn")
        self._pools: list[ProcessPoolExecutor | None] = [None] * self.slots

    def _pool(self, slot: int) -> ProcessPoolExecutor:
        pool = self._pools[slot]
        if pool is None:
            pool = ProcessPoolExecutor(
                max_workers=1,
                mp_context=self._context,
                initializer=_init_worker,
                initargs=(self.fitness, self.groups[slot]),
            )
            self._pools[slot] = pool
        return pool

    def _discard(self, slot: int) -> None:
        """Kill a slot's worker (and whatever it runs) so the next job gets a fresh one."""
        pool = self._pools[slot]
        self._pools[slot] = None
        if pool is None:
            return
        for process in list(getattr(pool, "_processes", {}).values()):
            process.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    async def evaluate(self, slot: int, job: Job) -> Evaluation:
        loop = asyncio.get_running_loop()
        deadline = job.timeout_s + HARNESS_GRACE_S
        try:
            future = loop.run_in_executor(self._pool(slot), _run_job, job)
            return await asyncio.wait_for(future, timeout=deadline)
        except TimeoutError:
            self._discard(slot)
            return Evaluation(
                status=EvalStatus.TIMEOUT,
                artifacts={
                    "error": f"the fitness did not return within {deadline:.0f} s; its worker was killed"
                },
            )
        except BrokenProcessPool as exc:
            self._discard(slot)
            return Evaluation(
                status=EvalStatus.ERROR,
                artifacts={"error": f"the evaluation worker died ({exc}); it was restarted"},
            )

    def close(self) -> None:
        for slot in range(self.slots):
            self._discard(slot)
