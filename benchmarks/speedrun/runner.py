"""One timed training run of a candidate, end to end: launch, clock, audit, evaluation, checks.

``run_seed`` copies the candidate into a harness folder, adds the clock module, starts the
training program in the sandbox (torchrun when more than one process), audits the clock
marks, verifies the checkpoint it scores is the one saved when the clock stopped, then
evaluates the initial and final weights in a second sandboxed process and checks what
that process returns (``evaluate.py``). It never raises for a candidate's fault: the
outcome, with its reason, is in the returned ``RunRecord``.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import stat
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from evolve.harness import compile_cache, phases
from evolve.harness.fitness import Limits, Policy, run_sandboxed
from evolve.harness.hashing import sha256_file
from evolve.types import EvalStatus

from .scoring import Export, evaluate_run, start_evaluation
from .stream import TokenServer
from .timer import ClockServer, ClockViolation, audit, init_sha256

HERE = Path(__file__).resolve().parent
CLOCK_MODULE = HERE / "clock.py"


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """How one seed is run and checked (built by the fitness from its configuration)."""

    preset: str
    vocab_size: int
    eval_seq_len: int
    eval_batch_size: int
    val_tokens: int
    nproc_per_node: int = 1
    run_timeout_s: float = 600.0
    eval_timeout_s: float = 300.0
    warmup_cap_s: float = 120.0
    compile_allowance_s: float = 60.0  # start-up seconds not charged to the time
    init_check_tokens: int = 8192
    init_loss_margin: float = 1.0
    causal_tol: float = 1e-2
    memory_bytes: int | None = None
    cpu_threads: int | None = None
    probe_every_s: float = 0.0
    overrides: dict = field(default_factory=dict)
    compile_cache: str | None = None  # shared with each run, written by warm_cache only
    strict_probes: bool = False  # the auditor's strict mode: more causality probes (``layout``)
    ahead: bool | None = None  # export and evaluation started with the training (None: on a GPU)

    def strict(self) -> RunSettings:
        """The auditor's strict mode (``EvalContext.strict``): twice the causality probes, and at
        least one for every scored batch."""
        return replace(self, strict_probes=True)


@dataclass(kw_only=True)
class RunRecord:
    """What one seed's run came to. ``status`` OK means a trusted loss and time exist."""

    seed: int
    status: EvalStatus
    reason: str = ""
    train_s: float | None = None
    loss: float | None = None
    init_loss: float | None = None
    untimed_s: float | None = None
    charged_s: float = 0.0  # start-up beyond the compile allowance, included in train_s
    post_stop_s: float | None = None
    eval_s: float | None = None
    causal_diff: float | None = None  # largest loss change the probe rows showed
    wall_s: float = 0.0
    params: int | None = None
    probes: list[tuple[float, float]] = field(default_factory=list)  # (training seconds, val loss)
    output: str = ""

    @property
    def ok(self) -> bool:
        return self.status == EvalStatus.OK

    @property
    def overhead_s(self) -> float | None:
        """Wall time of the whole run that was not timed training."""
        return None if self.train_s is None else self.wall_s - self.train_s


def _env(
    settings: RunSettings,
    *,
    seed: int,
    gpus: list[str] | None,
    ckpt_dir: Path,
    warming: bool = False,
) -> dict:
    env = {
        "EVOLVE_SEED": str(seed),
        "PYTHONHASHSEED": str(seed),
        "SPEEDRUN_PRESET": settings.preset,
        "SPEEDRUN_VOCAB_SIZE": str(settings.vocab_size),
        "SPEEDRUN_CKPT_DIR": str(ckpt_dir),
        "SPEEDRUN_OVERRIDES": json.dumps(settings.overrides),
    }
    # NVLink multicast stays off on shared machines (a program using it can take the host's GPUs down)
    env.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    if settings.compile_cache:  # shared, through a private layer (``evolve.harness.compile_cache``)
        env.update(compile_cache.environment(settings.compile_cache, warming))
    env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus) if gpus else ""
    if settings.cpu_threads:
        env["OMP_NUM_THREADS"] = str(settings.cpu_threads)
    if settings.probe_every_s:
        env["SPEEDRUN_PROBE_EVERY_S"] = str(settings.probe_every_s)
    return env


def _command(settings: RunSettings) -> list[str]:
    if settings.nproc_per_node == 1:
        return [sys.executable, "train.py"]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={settings.nproc_per_node}",
        "train.py",
    ]


def _written_by_training(run_dir: Path) -> list[Path]:
    """The folders of the run in ``run_dir`` that its training program may write (its code, its
    checkpoints): hidden from the evaluation, which sees only the checkpoints the harness
    verified, so nothing the program does after the stop reaches it (what it writes into the
    compile cache stays in its own private layer)."""
    return [run_dir / "code", run_dir / "ckpt"]


def _own_file(path: Path, sha256: str) -> bool:
    """``path`` is a plain file of the run's own with SHA-256 ``sha256``: not a symbolic or hard
    link, which would have the harness read and copy into the evaluation what it points to (a
    file hidden from the run, such as a validation shard whose digest is public)."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_nlink == 1 and sha256_file(path) == sha256


def run_seed(
    candidate: Path, *, scratch: Path, seed: int, keep: bool = False, **kwargs
) -> RunRecord:
    """Train the candidate once with ``seed``; see ``_run_seed``. The run's folder (code,
    checkpoints of hundreds of MB) is removed afterwards unless ``keep``."""
    try:
        return _run_seed(candidate, scratch=scratch, seed=seed, **kwargs)
    finally:
        if not keep:
            shutil.rmtree(scratch / f"seed-{seed}", ignore_errors=True)


def rescore(
    candidate: Path,
    record: RunRecord,
    *,
    run_dir: Path,
    settings: RunSettings,
    val: np.ndarray,
    gpus: list[str] | None,
    hidden: list[Path] = (),
) -> RunRecord:
    """The checkpoints of ``record``'s run, kept in ``run_dir`` by ``run_seed(keep=True)``,
    evaluated again under ``settings`` (``settings.strict()``: the auditor's re-evaluation) by a
    fresh evaluation process; a new record, whose ``eval_s`` is that evaluation's time."""
    again = RunRecord(seed=record.seed, status=EvalStatus.OK)
    ckpt_dir = run_dir / "ckpt"

    def fail(status: EvalStatus, reason: str) -> RunRecord:
        again.status, again.reason = status, reason
        return again

    begin = time.monotonic()
    env = _env(settings, seed=record.seed, gpus=gpus, ckpt_dir=ckpt_dir)
    scorer = start_evaluation(candidate, run_dir=run_dir, env=env, gpus=gpus, settings=settings,
                              hidden=[*hidden, *_written_by_training(run_dir)])  # fmt: skip
    export = Export(scorer, run_dir=run_dir, gpus=gpus, settings=settings, seed=record.seed)
    try:
        return evaluate_run(again, scorer=scorer, export=export, run_dir=run_dir, gpus=gpus, settings=settings,
                            val=val, init=ckpt_dir / "init.pt", final=ckpt_dir / "final.pt",
                            probes=[], begin=begin, fail=fail)  # fmt: skip
    finally:
        scorer.cancel()


def warm_cache(seed_program: Path, *, settings: RunSettings, scratch: Path, **kwargs) -> RunRecord:
    """Fill ``settings.compile_cache`` for the runs that read it: the seed program (the
    harness's own code) trained for one step with the shared cache folder writable. Its
    compilation happens before the clock starts (``compile_warmup_steps``), so one timed step
    is enough, and nothing is scored. Other arguments as for ``run_seed``."""
    one_step = replace(settings, overrides={**settings.overrides, "steps": 1})
    return run_seed(seed_program, settings=one_step, scratch=scratch, warming=True, **kwargs)


def _run_seed(
    candidate: Path,
    *,
    seed: int,
    settings: RunSettings,
    train_files: list[Path],
    val: np.ndarray,
    gpus: list[str] | None,
    scratch: Path,
    hidden: list[Path] = (),
    warming: bool = False,
) -> RunRecord:
    """Train the candidate in ``candidate`` once with ``seed`` and return the audited outcome.

    ``hidden`` (the data folder, other runs' folders) is made unreadable to the candidate's
    processes; the training tokens reach it only through the harness's ``TokenServer``, and
    the clock module is mounted read-only. ``warming``: ``warm_cache``'s run (the shared
    compile cache writable, the outcome the training's exit alone: nothing audited or scored).
    """
    begin = time.monotonic()
    phases.mark("run_setup")
    run_dir = scratch / f"seed-{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    code = run_dir / "code"
    shutil.copytree(
        candidate, code, ignore=shutil.ignore_patterns("__pycache__", "speedrun_clock.py")
    )
    shutil.copyfile(CLOCK_MODULE, code / "speedrun_clock.py")
    ckpt_dir = run_dir / "ckpt"
    ckpt_dir.mkdir()
    env = _env(settings, seed=seed, gpus=gpus, ckpt_dir=ckpt_dir, warming=warming)
    limits = Limits(timeout_s=settings.run_timeout_s, memory_bytes=settings.memory_bytes)
    cache = compile_cache.access(settings.compile_cache, warming)
    policy = Policy(
        writable=[ckpt_dir, "/dev/shm", *cache.writable],
        readonly=[code / "speedrun_clock.py", *cache.readonly],
        shared_caches=cache.shared_caches,
        hidden=[*hidden, run_dir / "eval"],  # the export (candidate code) may run beside it
    )
    # On a GPU the export and evaluation processes start now and import while the candidate
    # starts, and the export runs from the initial checkpoint once the clock starts (``Export``):
    # both overlap the training. On a CPU scale (2 cores) they start after it.
    evaluation = dict(run_dir=run_dir, env=env, gpus=gpus, settings=settings,
                      hidden=[*hidden, *_written_by_training(run_dir)])  # fmt: skip
    ahead = bool(gpus) if settings.ahead is None else settings.ahead
    scorer = start_evaluation(candidate, **evaluation) if ahead and not warming else None
    export = (
        None
        if scorer is None
        else Export(scorer, run_dir=run_dir, gpus=gpus, settings=settings, seed=seed)
    )
    try:
        phases.mark("servers")
        with (
            ClockServer() as clock,
            TokenServer(
                train_files,
                vocab_size=settings.vocab_size,
                phase=clock.phase,
                seed=secrets.randbits(63),
            ) as stream,
        ):
            env.update(SPEEDRUN_CLOCK=clock.address, SPEEDRUN_DATA=stream.address)
            launch = time.monotonic()
            phases.mark("sandbox_start", launch)
            with _export_when_started(clock, export, ckpt_dir / "init.pt"):
                result = run_sandboxed(
                    _command(settings), cwd=code, limits=limits, env=env, policy=policy
                )
            exited = time.monotonic()
        phases.mark_each([("startup", result.started_at), ("sandbox_exit", result.exited_at)])
        phases.mark("audit")
        record = RunRecord(seed=seed, status=EvalStatus.OK, output=result.tail(3000))

        def fail(status: EvalStatus, reason: str) -> RunRecord:
            record.status, record.reason, record.wall_s = status, reason, time.monotonic() - begin
            return record

        if result.timed_out:
            return fail(
                EvalStatus.TIMEOUT, f"training did not finish within {settings.run_timeout_s:.0f} s"
            )
        if warming:
            record.wall_s = time.monotonic() - begin
            if result.returncode != 0:
                return fail(
                    EvalStatus.ERROR, f"exit status {result.returncode}: {result.tail(600)}"
                )
            return record
        try:
            timing = audit(
                clock.marks,
                clock.problems,
                launch_t=launch,
                warmup_cap_s=settings.warmup_cap_s,
                allow_probes=settings.probe_every_s > 0,
            )
        except ClockViolation as exc:
            if result.returncode != 0 and not clock.problems:
                return fail(
                    EvalStatus.ERROR,
                    f"training exited with status {result.returncode}: {result.tail(600)}",
                )
            return fail(EvalStatus.REJECTED, str(exc))
        if result.returncode != 0:
            return fail(
                EvalStatus.ERROR,
                f"training exited with status {result.returncode} after the clock stopped: "
                f"{result.tail(600)}",
            )
        if result.leftover:
            return fail(
                EvalStatus.REJECTED,
                f"training left {result.leftover} process(es) running after it exited",
            )
        phases.mark_each([("training", timing.start_t), ("checkpoint", timing.stop_t)])
        record.charged_s = max(0.0, timing.untimed_s - settings.compile_allowance_s)
        record.train_s = timing.train_s + record.charged_s
        record.untimed_s, record.post_stop_s = timing.untimed_s, exited - timing.stop_t
        if record.charged_s:
            record.reason = (
                f"start-up took {timing.untimed_s:.1f} s; the {record.charged_s:.1f} s beyond the "
                f"compile allowance of {settings.compile_allowance_s:.0f} s are charged to the time"
            )
        final, init = ckpt_dir / "final.pt", ckpt_dir / "init.pt"
        if not _own_file(final, timing.final_sha256):
            return fail(
                EvalStatus.REJECTED,
                "the final checkpoint changed after the clock stopped, or is a link "
                "(the weights scored must be the file speedrun_clock.stop saved)",
            )
        if not _own_file(init, timing.init_sha256):
            return fail(
                EvalStatus.REJECTED,
                "the initial checkpoint saved at the first clock mark was changed, removed or linked",
            )
        probes = []
        for train_s, name, sha in timing.probes:
            path = ckpt_dir / Path(name).name
            if _own_file(path, sha):
                probes.append((train_s, path))
        if scorer is None:
            scorer = start_evaluation(candidate, **evaluation)
            export = Export(scorer, run_dir=run_dir, gpus=gpus, settings=settings, seed=seed)
        return evaluate_run(
            record,
            scorer=scorer,
            export=export,
            run_dir=run_dir,
            gpus=gpus,
            settings=settings,
            val=val,
            init=init,
            final=final,
            probes=probes,
            begin=begin,
            fail=fail,
        )
    finally:
        if scorer is not None:
            scorer.cancel()  # a no-op once it had its job
        if export is not None:
            export.close()


@contextlib.contextmanager
def _export_when_started(clock: ClockServer, export: Export | None, init: Path) -> Iterator[None]:
    """While the block (the training) runs, begin ``export`` from ``init`` when the clock starts."""
    if export is None:
        yield
        return
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if clock.started.wait(0.2):
                sha = init_sha256(clock.marks)
                if sha is not None:
                    export.begin(init, sha)
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
