"""One timed training run of a candidate, end to end: launch, clock, audit, evaluation, checks.

``run_seed`` copies the candidate into a harness folder, adds the clock module, starts the
training program in the sandbox (torchrun when more than one process), audits the clock
marks, verifies the checkpoint it scores is the one saved when the clock stopped, then
evaluates the initial and final weights in a second sandboxed process and checks what
that process returns (``evaluate.py``). It never raises for a candidate's fault: the
outcome, with its reason, is in the returned ``RunRecord``.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from evolve.benchmarks.speedrun.timer import ClockServer, ClockViolation, audit

from evolve.fitness import Limits, Policy, run_sandboxed
from evolve.types import EvalStatus

HERE = Path(__file__).resolve().parent
CLOCK_MODULE = HERE / "clock.py"
EVALUATOR = HERE / "evaluate.py"


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
    init_check_tokens: int = 8192
    init_loss_margin: float = 1.0
    spot_positions: int = 8
    causal_tol: float = 1e-2
    memory_bytes: int | None = None
    cpu_threads: int | None = None
    probe_every_s: float = 0.0
    overrides: dict = field(default_factory=dict)
    compile_cache: str | None = None  # a compiler cache shared between runs (trusted runs only)


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
    post_stop_s: float | None = None
    eval_s: float | None = None
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


def sha256_file(path: Path) -> str:
    """SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _env(
    settings: RunSettings,
    *,
    seed: int,
    gpus: list[str] | None,
    train_files: list[Path],
    ckpt_dir: Path,
) -> dict:
    env = {
        "EVOLVE_SEED": str(seed),
        "PYTHONHASHSEED": str(seed),
        "SPEEDRUN_PRESET": settings.preset,
        "SPEEDRUN_VOCAB_SIZE": str(settings.vocab_size),
        "SPEEDRUN_TRAIN_FILES": ":".join(str(p) for p in train_files),
        "SPEEDRUN_CKPT_DIR": str(ckpt_dir),
        "SPEEDRUN_OVERRIDES": json.dumps(settings.overrides),
    }
    # NVLink multicast stays off on shared machines (a program using it can take the host's GPUs down)
    env.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    if settings.compile_cache:
        Path(settings.compile_cache).mkdir(
            parents=True, exist_ok=True
        )  # the sandbox grants only existing paths
        env["TORCHINDUCTOR_CACHE_DIR"] = str(Path(settings.compile_cache) / "inductor")
        env["TRITON_CACHE_DIR"] = str(Path(settings.compile_cache) / "triton")
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
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
) -> RunRecord:
    """Train the candidate in ``candidate`` once with ``seed`` and return the audited outcome.

    ``hidden`` (the validation shards) is made unreadable to the candidate's processes
    where the sandbox can (Landlock); the clock module is mounted read-only.
    """
    begin = time.monotonic()
    run_dir = scratch / f"seed-{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    code = run_dir / "code"
    shutil.copytree(
        candidate, code, ignore=shutil.ignore_patterns("__pycache__", "speedrun_clock.py")
    )
    shutil.copyfile(CLOCK_MODULE, code / "speedrun_clock.py")
    ckpt_dir = run_dir / "ckpt"
    ckpt_dir.mkdir()
    env = _env(settings, seed=seed, gpus=gpus, train_files=train_files, ckpt_dir=ckpt_dir)
    limits = Limits(timeout_s=settings.run_timeout_s, memory_bytes=settings.memory_bytes)
    policy = Policy(
        writable=[
            ckpt_dir,
            "/dev/shm",
            *([settings.compile_cache] if settings.compile_cache else []),
        ],
        readonly=[code / "speedrun_clock.py"],
        hidden=list(hidden),
    )

    with ClockServer() as clock:
        env["SPEEDRUN_CLOCK"] = clock.address
        launch = time.monotonic()
        result = run_sandboxed(_command(settings), cwd=code, limits=limits, env=env, policy=policy)
        exited = time.monotonic()
    record = RunRecord(seed=seed, status=EvalStatus.OK, output=result.tail(3000))

    def fail(status: EvalStatus, reason: str) -> RunRecord:
        record.status, record.reason, record.wall_s = status, reason, time.monotonic() - begin
        return record

    if result.timed_out:
        return fail(
            EvalStatus.TIMEOUT, f"training did not finish within {settings.run_timeout_s:.0f} s"
        )
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
            return fail(EvalStatus.ERROR, f"training exited with status {result.returncode}")
        return fail(EvalStatus.REJECTED, str(exc))
    if result.returncode != 0:
        return fail(
            EvalStatus.ERROR,
            f"training exited with status {result.returncode} after the clock stopped",
        )
    if result.leftover:
        return fail(
            EvalStatus.REJECTED,
            f"training left {result.leftover} process(es) running after it exited",
        )
    record.train_s, record.untimed_s, record.post_stop_s = (
        timing.train_s,
        timing.untimed_s,
        exited - timing.stop_t,
    )

    final, init = ckpt_dir / "final.pt", ckpt_dir / "init.pt"
    if not final.is_file() or sha256_file(final) != timing.final_sha256:
        return fail(
            EvalStatus.REJECTED,
            "the final checkpoint changed after the clock stopped "
            "(the weights scored must be the ones speedrun_clock.stop saved)",
        )
    if not init.is_file() or sha256_file(init) != timing.init_sha256:
        return fail(
            EvalStatus.REJECTED,
            "the initial checkpoint saved at the first clock mark was changed or removed",
        )
    probes = []
    for train_s, name, sha in timing.probes:
        path = ckpt_dir / Path(name).name
        if path.is_file() and sha256_file(path) == sha:
            probes.append((train_s, path))
    return _evaluate(
        record,
        code=code,
        run_dir=run_dir,
        env=env,
        gpus=gpus,
        settings=settings,
        val=val,
        init=init,
        final=final,
        probes=probes,
        begin=begin,
        fail=fail,
        hidden=hidden,
    )


def _evaluate(
    record: RunRecord,
    *,
    code: Path,
    run_dir: Path,
    env: dict,
    gpus: list[str] | None,
    settings: RunSettings,
    val: np.ndarray,
    init: Path,
    final: Path,
    probes: list[tuple[float, Path]],
    begin: float,
    fail,
    hidden: list[Path],
) -> RunRecord:
    """Evaluate initial, probe and final weights in a fresh sandboxed process and check its answers."""
    rng = np.random.default_rng(record.seed)
    n = settings.val_tokens
    spot = sorted(
        int(p) for p in rng.choice(n, size=min(settings.spot_positions, n), replace=False)
    )
    init_tokens = min(
        n,
        max(
            settings.eval_seq_len,
            settings.init_check_tokens // settings.eval_seq_len * settings.eval_seq_len,
        ),
    )
    checkpoints = [
        {"name": "init", "path": str(init), "tokens": init_tokens},
        {"name": "final", "path": str(final), "tokens": n, "spot": True, "causal": True},
    ]
    checkpoints += [
        {"name": f"probe{i}", "path": str(p), "tokens": n} for i, (_, p) in enumerate(probes)
    ]
    out_dir = run_dir / "eval"
    out_dir.mkdir()
    out = out_dir / "eval.npz"
    spec = {
        "vocab_size": settings.vocab_size,
        "seq_len": settings.eval_seq_len,
        "batch_size": settings.eval_batch_size,
        "spot": spot,
        "checkpoints": checkpoints,
        "out": str(out),
        "device": "cuda" if gpus else "cpu",
    }
    eval_env = {**env, "CUDA_VISIBLE_DEVICES": gpus[0] if gpus else ""}
    eval_env.pop("SPEEDRUN_CLOCK", None)
    eval_env.pop("SPEEDRUN_TRAIN_FILES", None)
    started = time.monotonic()
    result = run_sandboxed(
        [sys.executable, str(EVALUATOR)],
        cwd=code,
        env=eval_env,
        limits=Limits(timeout_s=settings.eval_timeout_s, memory_bytes=settings.memory_bytes),
        policy=Policy(writable=[out_dir], readonly=[run_dir / "ckpt"], hidden=list(hidden)),
        stdin=json.dumps(spec).encode() + b"\n" + val[: n + 1].astype("<u2").tobytes(),
    )
    record.eval_s = time.monotonic() - started
    if not result.ok or not out.is_file():
        record.output = result.tail(3000)
        status = EvalStatus.TIMEOUT if result.timed_out else EvalStatus.ERROR
        return fail(
            status,
            f"evaluating the checkpoint failed (exit {result.returncode}): {result.tail(600)}",
        )
    with np.load(out, allow_pickle=False) as arrays:
        data = {key: arrays[key] for key in arrays.files}
    summary = json.loads(data["summary"].tobytes())
    losses = data["losses_final"].astype(np.float64)
    if losses.shape != (n,) or not np.isfinite(losses).all():
        return fail(EvalStatus.INVALID, "the model's validation loss is not finite")
    targets = val[1 : n + 1].astype(np.int64)
    for position, row in zip(
        data["spot_positions_final"], data["spot_logits_final"].astype(np.float64), strict=True
    ):
        top = row.max()
        expected = top + math.log(np.exp(row - top).sum()) - row[targets[position]]
        if abs(expected - losses[position]) > 1e-3 + 1e-4 * abs(expected):
            return fail(
                EvalStatus.REJECTED,
                f"the evaluation's loss at position {position} ({losses[position]:.5f}) "
                f"disagrees with the logits it returned ({expected:.5f}); was the loss computation patched?",
            )
    causal = summary["final"]["causal_diff"]
    if causal is None or causal > settings.causal_tol:
        return fail(
            EvalStatus.REJECTED,
            f"the model is not causal: logits before position t changed by {causal} "
            "when tokens from t on were replaced (a language model may not look ahead)",
        )
    record.params = int(summary["final"]["params"])
    record.init_loss = float(data["losses_init"].astype(np.float64).mean())
    floor = math.log(settings.vocab_size) - settings.init_loss_margin
    if record.init_loss < floor:
        return fail(
            EvalStatus.REJECTED,
            f"the model was already trained when the clock started: its initial loss "
            f"{record.init_loss:.3f} is below {floor:.3f} (ln vocab - {settings.init_loss_margin}); train only "
            "after speedrun_clock.start",
        )
    record.loss = float(losses.mean())
    record.probes = [
        (t, float(data[f"losses_probe{i}"].astype(np.float64).mean()))
        for i, (t, _) in enumerate(probes)
    ]
    record.wall_s = time.monotonic() - begin
    return record
