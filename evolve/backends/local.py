"""The local evaluation backend: worker processes on this machine, one per slot.

Each slot has one long-lived worker process, reached through a pipe that the event loop
watches directly (no executor threads: they cost milliseconds per job). A slot on a GPU machine owns
``gpus_per_eval`` GPUs through CUDA_VISIBLE_DEVICES, set before the worker imports
anything. The driver never runs a fitness itself: a fitness that hangs past its outer
deadline, or kills its worker, is recorded as a failed evaluation and the slot's worker is
replaced (a worker that dies is given one fresh try first: it may have been lost to the
machine). A worker that cannot prepare the evaluation (its folders, a full disk) raises
``InfrastructureFault``: the run ends, and the candidate is evaluated again at resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext

from evolve.backends.base import HARNESS_GRACE_S, run_job
from evolve.harness import phases
from evolve.harness.fitness import Fitness
from evolve.harness.gpus import gpu_groups
from evolve.sandbox import lifetime
from evolve.sandbox.cores import inherited, split
from evolve.types import EvalStatus, Evaluation, InfrastructureFault, Job

log = logging.getLogger("evolve")

STOP_GRACE_S = 10.0  # how long a discarded worker may take to stop its sandboxed processes


# --- worker side ---------------------------------------------------------------------------------


def _serve(conn: Connection, fitness: Fitness, gpu: str | None, driver: int) -> None:
    """A slot's worker: evaluate each job received on ``conn`` until the driver hangs up.

    Ctrl-C is the driver's to handle; SIGTERM (the driver discarding this worker, or the
    kernel when the driver dies, even by SIGKILL) unwinds the job, so the sandbox kills the
    candidate's process tree and the job's folders are removed.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    lifetime.die_with_parent(signal.SIGTERM, parent=driver)
    # each phase's name as it begins and its details, as (phase, detail); then the Evaluation
    with phases.reported(lambda phase, detail: conn.send((phase, detail))):
        while True:
            try:
                job = conn.recv()
            except (EOFError, OSError):  # the driver closed the pipe or died
                return
            try:
                answer: Evaluation | InfrastructureFault = run_job(fitness, job, gpu)
            except InfrastructureFault as fault:  # the driver ends the run with it
                answer = fault
            conn.send(answer)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


# --- driver side ---------------------------------------------------------------------------------


class Watch:
    """What a long evaluation is doing, for the log: once it has run ``QUIET_S``, the phase it is
    in, then each phase it enters (a burst of phases within ``SETTLE_S`` is one line, the last),
    and at least every ``EVERY_S`` the phase it is still in, with its latest detail (e.g.
    ``training: step 120, loss 3.41``; a detail alone brings no line forward)."""

    QUIET_S = 5.0
    SETTLE_S = 1.0
    EVERY_S = 30.0

    def __init__(self, candidate_id: str) -> None:
        self.label = candidate_id[:8]
        self.start = time.monotonic()
        self.phase = "waiting for its worker"
        self.detail = ""
        self.next_at = self.start + self.QUIET_S  # when the next line is due

    def due(self) -> float:
        """Seconds until the next line, if no phase begins before."""
        return self.next_at - time.monotonic()

    def heard(self, phase: str, detail: str = "") -> None:
        """The evaluation entered ``phase`` (its worker said so; a phase marked again is no news),
        or, with a ``detail``, told how it goes."""
        self.detail = detail
        if phase == self.phase:
            return
        self.phase = phase
        now = time.monotonic()
        if now >= self.start + self.QUIET_S:
            self.next_at = min(self.next_at, now + self.SETTLE_S)

    def say(self) -> None:
        now = time.monotonic()
        doing = f"{self.phase}: {self.detail}" if self.detail else self.phase
        log.info("evaluating %s: %s (%.0f s in)", self.label, doing, now - self.start)
        self.next_at = now + self.EVERY_S


@contextlib.contextmanager
def _gpus_inherited(gpu: str | None) -> Iterator[None]:
    """Within the block, this process's CUDA_VISIBLE_DEVICES is ``gpu`` (unchanged when None)."""
    if gpu is None:
        yield
        return
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    try:
        yield
    finally:
        if before is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


class _Worker:
    """One worker process and the pipe to it; the event loop waits on the pipe, no threads."""

    def __init__(
        self, context: BaseContext, fitness: Fitness, gpu: str | None, own: tuple[int, ...]
    ) -> None:
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=_serve, args=(child, fitness, gpu, os.getpid()), name=f"evolve-worker-{gpu}"
        )
        # the worker sees only its GPUs and runs on its cores, before it imports the fitness
        with _gpus_inherited(gpu), inherited(own):
            self.process.start()
        child.close()

    async def call(self, job: Job, timeout_s: float) -> Evaluation:
        """The job's evaluation; meanwhile a long one's phases are logged (``Watch``)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        watch = Watch(job.candidate_id)
        self.conn.send(job)
        while True:
            left = end - loop.time()
            if left <= 0:
                raise TimeoutError
            if not await self._readable(min(left, watch.due())):
                watch.say()
                continue
            message = self.conn.recv()  # EOFError when the worker died instead of answering
            if isinstance(message, InfrastructureFault):
                raise message
            if not isinstance(message, tuple):
                return message
            watch.heard(*message)

    async def _readable(self, timeout_s: float) -> bool:
        """Whether the pipe has something to read within ``timeout_s``."""
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        fd = self.conn.fileno()
        loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
        try:
            await asyncio.wait_for(ready, max(0.0, timeout_s))
        except TimeoutError:
            return False
        finally:
            loop.remove_reader(fd)
        return True

    def kill(self) -> None:
        """Stop the worker: SIGTERM lets it clean up its sandbox; SIGKILL if it does not exit."""
        self.process.terminate()
        self.process.join(STOP_GRACE_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


class LocalBackend:
    """Evaluates on this machine, one worker process per slot.

    Args:
        fitness: the benchmark's fitness (pickled once into each worker).
        gpus_per_eval: GPUs each evaluation needs (0 = CPU).
        workers: number of slots; None = one per GPU group, or one per CPU core.

    Attributes:
        cores: each slot's CPU cores (``evolve.sandbox.cores.split``): its worker and every sandboxed
            command it starts run on them, so evaluations side by side do not share a core
            (unless there are more slots than cores: then a warning says so).
    """

    def __init__(
        self, *, fitness: Fitness, gpus_per_eval: int = 0, workers: int | None = None
    ) -> None:
        self.fitness = fitness
        self.groups = gpu_groups(gpus_per_eval, workers)
        self.slots = len(self.groups)
        self.cores = split(self.slots)
        self._context = multiprocessing.get_context("spawn")
        # every slot's worker starts now, side by side: the first jobs on each slot do not wait
        # for a process to start and import the fitness, one slot after another
        self._workers: list[_Worker | None] = [
            _Worker(self._context, fitness, gpu, own)
            for gpu, own in zip(self.groups, self.cores, strict=True)
        ]

    def _worker(self, slot: int) -> _Worker:
        worker = self._workers[slot]
        if worker is None:
            worker = self._workers[slot] = _Worker(
                self._context, self.fitness, self.groups[slot], self.cores[slot]
            )
        return worker

    def _discard(self, slot: int) -> None:
        """Kill a slot's worker (and whatever it runs) so the next job gets a fresh one."""
        worker, self._workers[slot] = self._workers[slot], None
        if worker is not None:
            worker.kill()

    async def evaluate(self, slot: int, job: Job) -> Evaluation:
        deadline = job.timeout_s + HARNESS_GRACE_S
        for _ in range(2):  # a worker lost once may be the machine's doing: a fresh one tries again
            try:
                return await self._worker(slot).call(job, deadline)
            except TimeoutError:
                self._discard(slot)
                return Evaluation(
                    status=EvalStatus.TIMEOUT,
                    artifacts={
                        "error": f"the fitness did not return within {deadline:.0f} s; its worker was killed"
                    },
                )
            except (EOFError, OSError) as exc:
                self._discard(slot)
                lost = type(exc).__name__
        return Evaluation(
            status=EvalStatus.ERROR,
            artifacts={
                "error": f"the evaluation worker died ({lost}) twice, on two fresh workers; it was restarted"
            },
        )

    def close(self) -> None:
        for slot in range(self.slots):
            self._discard(slot)
