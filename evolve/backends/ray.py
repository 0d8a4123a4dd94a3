"""The Ray evaluation backend: each evaluation is a task on a Ray cluster; the driver keeps the archive.

How it works:
- ``address``: ``auto`` joins the cluster this machine belongs to (``ray start --head``, or
  ``RAY_ADDRESS``) and, when there is none, starts a local one here; ``local`` always
  starts a local one; anything else (``host:6379``, ``ray://host:10001``) must be a running
  cluster. A process already connected to Ray (``ray.init`` done by the caller) is reused.
- Each evaluation is one task requesting the benchmark's ``gpus`` as ``num_gpus`` plus
  ``num_cpus`` and, if set, ``memory``. The fitness is put once into the object store; the
  candidate's files travel in the task's arguments, so workers need no shared disk. The
  fitness is pickled by reference, so ``evolve`` (and the benchmark's module) must be
  importable on every node: install the same version there, or pass a ``runtime_env``.
  Each task hashes the benchmark's harness files where it runs; a node whose files differ
  from the driver's (another version, or none) stops the run before it scores anything:
  its task returns without evaluating, and the driver waits for that rather than cancelling it
  at once (a forced cancel that meets a task's own return crashes Ray's driver); one still
  running after ``MISMATCH_END_S`` (a node running other code) is cancelled.
- Ray assigns the GPUs: a task sees its own through ``CUDA_VISIBLE_DEVICES`` (which
  becomes ``EvalContext.gpu``), and a GPU worker serves one evaluation, then exits.
- The task first reports that it started; the timeout (the job's plus ``grace_s``) counts
  from then, not from submission, so queueing on a busy cluster is not a timeout. Past it
  the task is cancelled with ``force=True``, which kills its worker; the candidate's own
  processes were already killed by the sandbox at the job's timeout, inside the task.
- Ray's own retries are off (``max_retries=0``); a task whose worker or node died is
  resubmitted here, up to ``max_attempts`` times, so a candidate is never lost and only
  one evaluation is returned (and recorded) per candidate. After the last attempt it is
  an ERROR evaluation, as a crashing worker is in the local backend.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import platform
import socket
import traceback
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

from evolve.backends.base import HARNESS_GRACE_S, run_job
from evolve.harness.fitness import Fitness
from evolve.sandbox import unreadable
from evolve.types import EvalStatus, Evaluation, EvolveError, Job

log = logging.getLogger("evolve")

INSTALL = "pip install 'evolve[ray]'"
RETRYABLE = ("WorkerCrashedError", "NodeDiedError", "OutOfMemoryError")
PENDING_WARNING_S = 120.0
# A task on a node whose harness differs returns at once; one still running after this is cancelled.
MISMATCH_END_S = 10.0
CONFIG_KEYS = (
    "address",
    "num_cpus",
    "memory_gb",
    "max_attempts",
    "runtime_env",
    "local_cpus",
    "local_gpus",
    "check_harness",
)


class RayBackendError(EvolveError):
    """Ray is missing, unreachable, or cannot run this benchmark's evaluations; the message names the fix."""


def import_ray() -> ModuleType:
    """The ``ray`` module, or a RayBackendError naming the install command."""
    try:
        import ray
    except ImportError as exc:
        raise RayBackendError(
            f"backend=ray needs Ray, which is not installed here ({exc}); install it with: {INSTALL}"
        ) from exc
    return ray


def _check_reachable(address: str) -> None:
    """Fail fast when nothing listens at a ``host:port`` address (Ray itself retries for minutes)."""
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if address in ("auto", "local") or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as exc:
        raise RayBackendError(
            f"nothing answers at backend.address={address!r} ({exc}); start the cluster there with "
            f"`ray start --head --port={port}`, or use backend.address=local to start one on this machine"
        ) from exc


# --- worker side ---------------------------------------------------------------------------------


def harness_digest(specs: Sequence[str]) -> str:
    """SHA-256 over the harness files named by ``specs`` (``pkg://`` or absolute), resolved here.

    A missing file counts as different content, so a node lacking the benchmark's files
    disagrees with the driver as a node holding other versions of them does.
    """
    from evolve.paths import resolve_path

    digest = hashlib.sha256()
    for spec in specs:
        path = resolve_path(spec)
        digest.update(f"{spec}\0".encode())
        digest.update(path.read_bytes() if path.is_file() else b"\0<missing>\0")
    return digest.hexdigest()


def _evaluation_task(
    fitness: Fitness, job: Job, harness: Sequence[str], expected: str, unseen: Sequence[str]
) -> Iterator[dict[str, Any] | Evaluation]:
    """The Ray task (a generator): where it runs and the harness it sees, then the evaluation.

    When the harness differs from ``expected`` (the driver's), it stops before evaluating.
    ``unseen``: the driver's ``evolve.sandbox.unreadable`` paths (the run's directory), hidden here too.
    """
    import ray

    gpu_ids = ray.get_gpu_ids()
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES") or ",".join(str(g) for g in gpu_ids)
    gpu = gpu if gpu_ids else None
    digest = harness_digest(harness) if harness else ""
    yield {"host": platform.node(), "pid": os.getpid(), "gpu": gpu, "harness": digest}
    if digest != expected:
        return
    try:
        with unreadable.hidden(*map(Path, unseen)):
            evaluation = run_job(fitness, job, gpu)
    except Exception as exc:  # e.g. a candidate file escaping its workdir: this candidate fails
        evaluation = Evaluation(
            status=EvalStatus.ERROR,
            artifacts={
                "error": f"evaluating raised {type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-8000:],
            },
        )
    yield evaluation


# --- driver side ---------------------------------------------------------------------------------


class RayBackend:
    """Evaluates each job as a task on a Ray cluster.

    Args:
        fitness: the benchmark's fitness (put once into Ray's object store).
        gpus_per_eval: GPUs each evaluation requests (Ray's ``num_gpus``).
        workers: concurrent evaluations; None = as many as the cluster's resources allow now.
        address: ``auto``, ``local``, or the address of a running cluster (see the module doc).
        num_cpus: CPUs each evaluation requests.
        memory_gb: memory each evaluation requests (Ray schedules by it; it is not a limit).
        max_attempts: times an evaluation is run when its worker or node dies under it.
        runtime_env: Ray runtime environment of the job (e.g. ``{"working_dir": "."}``).
        local_cpus: CPUs of a cluster started here (None: all of this machine's).
        local_gpus: GPUs of a cluster started here (None: all that Ray detects).
        harness: the benchmark's harness files (``pkg://`` or paths, as in its config); each
            task hashes them where it runs, and a node whose hash differs stops the run.
        check_harness: False skips that check (for a fitness that carries all it needs).
        grace_s: how long past the job's timeout the fitness may take before its task is killed.
    """

    def __init__(
        self,
        *,
        fitness: Fitness,
        gpus_per_eval: int = 0,
        workers: int | None = None,
        address: str = "auto",
        num_cpus: float = 1.0,
        memory_gb: float | None = None,
        max_attempts: int = 3,
        runtime_env: Mapping[str, Any] | None = None,
        local_cpus: int | None = None,
        local_gpus: int | None = None,
        harness: Sequence[str] = (),
        check_harness: bool = True,
        grace_s: float = HARNESS_GRACE_S,
    ) -> None:
        if max_attempts < 1:
            raise RayBackendError(f"backend.max_attempts must be at least 1, got {max_attempts}")
        self._ray = ray = import_ray()
        self.gpus_per_eval = gpus_per_eval
        self.num_cpus = float(num_cpus)
        self.memory_bytes = int(memory_gb * 2**30) if memory_gb else None
        self.max_attempts = max_attempts
        self.grace_s = grace_s
        # relative paths are made absolute here: a worker's working directory is not ours
        self.harness = tuple(
            spec if str(spec).startswith("pkg://") else str(Path(spec).expanduser().resolve())
            for spec in (harness if check_harness else ())
        )
        self._harness_digest = harness_digest(self.harness) if self.harness else ""
        self._running: set[Any] = set()
        self._owns_connection = self._connect(
            address, runtime_env=dict(runtime_env or {}), cpus=local_cpus, gpus=local_gpus
        )
        try:
            self.slots = workers or self._capacity()
            self._fitness = ray.put(fitness)
            options: dict[str, Any] = {
                "num_cpus": self.num_cpus,
                "num_gpus": gpus_per_eval,
                "max_retries": 0,
                "retry_exceptions": False,
                "num_returns": "streaming",
                # a GPU worker exits after each evaluation, so no CUDA context outlives it
                "max_calls": 1 if gpus_per_eval else 0,
            }
            if self.memory_bytes:
                options["memory"] = self.memory_bytes
            self._task = ray.remote(**options)(_evaluation_task)
        except BaseException:
            self.close()
            raise
        self._retryable = tuple(getattr(ray.exceptions, name) for name in RETRYABLE)

    @classmethod
    def from_config(
        cls,
        node: Mapping[str, Any],
        *,
        fitness: Fitness,
        gpus_per_eval: int,
        workers: int | None,
        harness: Sequence[str] = (),
    ) -> RayBackend:
        """A RayBackend from the ``backend`` config group (``configs/backend/ray.yaml``)."""
        options = {k: v for k, v in node.items() if k != "name"}
        unknown = sorted(set(options) - set(CONFIG_KEYS))
        if unknown:
            raise RayBackendError(
                f"unknown key(s) {unknown} in backend (ray); valid keys: {', '.join(CONFIG_KEYS)}"
            )
        return cls(
            fitness=fitness,
            gpus_per_eval=gpus_per_eval,
            workers=workers,
            harness=harness,
            **options,
        )

    # --- connecting ----------------------------------------------------------------------------

    def _connect(
        self, address: str, *, runtime_env: dict[str, Any], cpus: int | None, gpus: int | None
    ) -> bool:
        """Join or start a cluster; True when this backend made the connection (and ends it)."""
        ray = self._ray
        if ray.is_initialized():
            log.info("using this process's existing Ray connection")
            return False
        common: dict[str, Any] = {"logging_level": logging.WARNING}
        if runtime_env:
            common["runtime_env"] = runtime_env
        local = {"num_cpus": cpus, "num_gpus": gpus, "include_dashboard": False}
        if address == "local":
            ray.init(address="local", **local, **common)
            log.info("started a local Ray cluster on this machine")
            return True
        _check_reachable(address)
        try:
            ray.init(address=address, **common)
        except ConnectionError as exc:
            if address != "auto":
                raise RayBackendError(
                    f"cannot join the Ray cluster at backend.address={address!r} ({exc}); if it uses "
                    "token authentication (`ray start` turns it on from Ray 2.59), set RAY_AUTH_MODE=token "
                    "and RAY_AUTH_TOKEN (or ~/.ray/auth_token) here as on the cluster"
                ) from exc
            log.info(
                "no running Ray cluster found (backend.address=auto): starting one on this machine"
            )
            ray.init(address="local", **local, **common)
            return True
        log.info("joined the Ray cluster at %s", address)
        return True

    def _capacity(self) -> int:
        """How many evaluations the cluster can run at once now."""
        total = self._ray.cluster_resources()
        limits = {"CPU": total.get("CPU", 0.0) / self.num_cpus if self.num_cpus else float("inf")}
        if self.gpus_per_eval:
            limits["GPU"] = total.get("GPU", 0.0) / self.gpus_per_eval
        if self.memory_bytes:
            limits["memory"] = total.get("memory", 0.0) / self.memory_bytes
        slots = int(min(limits.values()))
        nodes = len([n for n in self._ray.nodes() if n.get("Alive")])
        if slots < 1:
            short = min(limits, key=limits.__getitem__)
            raise RayBackendError(
                f"the Ray cluster ({nodes} node(s): {total.get('CPU', 0):g} CPUs, {total.get('GPU', 0):g} GPUs, "
                f"{total.get('memory', 0) / 2**30:.0f} GiB) has too little {short} for one evaluation "
                f"({self.num_cpus:g} CPU, {self.gpus_per_eval} GPU, memory {self.memory_bytes or 0} B); join "
                "nodes that have it (`ray start --address=HEAD:6379`), lower backend.num_cpus/memory_gb, or set "
                "search.workers=N to queue for an autoscaling cluster"
            )
        log.info(
            "Ray cluster: %d node(s), %g CPUs, %g GPUs; %d evaluation slot(s) of %g CPU, %d GPU",
            nodes,
            total.get("CPU", 0),
            total.get("GPU", 0),
            slots,
            self.num_cpus,
            self.gpus_per_eval,
        )
        return slots

    # --- evaluating ----------------------------------------------------------------------------

    async def evaluate(self, slot: int, job: Job) -> Evaluation:
        """Run ``job`` as a Ray task, again if its worker dies, and return its one evaluation."""
        lost: list[str] = []
        for attempt in range(1, self.max_attempts + 1):
            try:
                evaluation = await self._attempt(job)
            except self._retryable as exc:
                reason = (
                    f"attempt {attempt}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                )
                lost.append(reason)
                log.warning("candidate %s lost its Ray worker (%s)", job.candidate_id[:8], reason)
                continue
            if lost:
                evaluation = replace(
                    evaluation,
                    artifacts={**evaluation.artifacts, "lost_workers": "\n".join(lost)},
                )
            return evaluation
        return Evaluation(
            status=EvalStatus.ERROR,
            artifacts={
                "error": f"the evaluation's Ray worker died in all {self.max_attempts} attempts "
                "(raise backend.max_attempts if the cluster is flaky)",
                "lost_workers": "\n".join(lost),
            },
        )

    async def _attempt(self, job: Job) -> Evaluation:
        ray = self._ray
        generator = self._task.remote(
            self._fitness, job, self.harness, self._harness_digest, unreadable.paths()
        )
        self._running.add(generator)
        try:
            where = await (await self._started(generator, job))
            if where["harness"] != self._harness_digest:
                await self._ended(generator)
                raise RayBackendError(
                    f"the benchmark's harness files on Ray node {where['host']} differ from this "
                    f"machine's ({', '.join(self.harness)}), so its scores would not be comparable; "
                    "install the same version of evolve and the benchmark on every node (or share them "
                    "through backend.runtime_env), or set backend.check_harness=false if the fitness "
                    "carries everything it needs"
                )
            deadline = job.timeout_s + self.grace_s
            try:
                result = await asyncio.wait_for(generator.__anext__(), timeout=deadline)
            except TimeoutError:
                ray.cancel(generator, force=True)
                return Evaluation(
                    status=EvalStatus.TIMEOUT,
                    artifacts={
                        "error": f"the fitness did not return within {deadline:.0f} s; its Ray task was "
                        f"cancelled and its worker (pid {where['pid']} on {where['host']}) killed"
                    },
                )
            return await result
        except asyncio.CancelledError:
            ray.cancel(generator, force=True)
            raise
        except ray.exceptions.RayTaskError as exc:
            raise RayBackendError(
                f"a Ray worker could not run the evaluation of {job.candidate_id[:8]}: {exc}\n"
                "Is the same version of evolve (and the benchmark's package) installed on every node? "
                "Install it there, or pass backend.runtime_env (e.g. {working_dir: ., pip: [...]})."
            ) from exc
        except ray.exceptions.RuntimeEnvSetupError as exc:
            raise RayBackendError(
                f"Ray could not set up backend.runtime_env on a worker: {exc}"
            ) from exc
        finally:
            self._running.discard(generator)

    async def _ended(self, generator: Any) -> None:
        """Let a task that returns by itself (one on a node whose harness differs) end, and
        cancel it only if it has not within ``MISMATCH_END_S`` (a node running other code).

        Not a cancel at once: a forced cancel that meets the task's own return crashes Ray's
        driver (Ray 2.60: "Tried to complete task that was not pending", about once in 250)."""

        async def drained() -> None:
            async for _ in generator:
                pass

        try:
            await asyncio.wait_for(drained(), timeout=MISMATCH_END_S)
        except TimeoutError:
            self._ray.cancel(generator, force=True)

    async def _started(self, generator: Any, job: Job) -> Any:
        """The reference to the task's first item (where it runs), waiting while it queues."""
        first = asyncio.ensure_future(generator.__anext__())
        waited = 0.0
        try:
            while True:
                done, _ = await asyncio.wait({first}, timeout=PENDING_WARNING_S)
                if done:
                    return first.result()
                waited += PENDING_WARNING_S
                log.warning(
                    "candidate %s has waited %.0f s for a Ray worker with %g CPU and %d GPU; "
                    "is the cluster busy or missing such nodes? (ray status)",
                    job.candidate_id[:8],
                    waited,
                    self.num_cpus,
                    self.gpus_per_eval,
                )
        finally:
            first.cancel()

    def close(self) -> None:
        """Cancel evaluations still running and disconnect (stopping a cluster started here)."""
        ray = self._ray
        for generator in list(self._running):
            try:
                ray.cancel(generator, force=True)
            except Exception as exc:  # the cluster may already be gone
                log.debug("could not cancel a Ray task: %s", exc)
        self._running.clear()
        if self._owns_connection and ray.is_initialized():
            ray.shutdown()
        self._owns_connection = False
