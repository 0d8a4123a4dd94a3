"""The kernels benchmark's own processes, all through the harness layer's protocol: the timer
(which starts the candidate's process itself) and the referee, started ahead of their jobs,
the C++ build, and the fast exit of each."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from evolve.harness.fitness import Limits, Policy, Result, Started, start_sandboxed
from evolve.harness.protocol import SAFE_PATH, job_input, read_verdict

TIMER = "evolve.benchmarks.kernels.timer"
REFEREE = "evolve.benchmarks.kernels.referee"


def start_harness(module: str, *, cwd: Path, timeout_s: float, env: Mapping[str, str], gpu: bool,
                  writable: tuple[Path, ...] = (), args: tuple[str, ...] = ()) -> Started:  # fmt: skip
    """Start ``python -P -m module *args`` ahead of its job: it imports what it needs, then
    waits for the job that ``finish`` sends (``sandbox.start``; ``cancel()`` it when unused)."""
    return start_sandboxed([sys.executable, *SAFE_PATH, "-m", module, *args], cwd=cwd,
                           limits=harness_limits(timeout_s, gpu), env=dict(env),
                           policy=Policy(writable=writable))  # fmt: skip


def harness_limits(timeout_s: float, gpu: bool) -> Limits:
    """The limits of the benchmark's own processes: no memory cap with CUDA (it reserves address
    space at once), no process cap (compile workers), 4 MiB of output."""
    return Limits(
        timeout_s=timeout_s,
        memory_bytes=None if gpu else 24 << 30,
        processes=None,
        output_bytes=4 << 20,
    )


def harness_json(module: str, job: Mapping[str, Any], *, cwd: Path, timeout_s: float, env: Mapping[str, str],
                 gpu: bool, writable: tuple[Path, ...] = (), started: Started | None = None,
                 ) -> tuple[dict[str, Any] | None, Result]:  # fmt: skip
    """Run a harness-only process (referee, build) through the harness layer's protocol: the job
    with a fresh nonce on stdin, the verdict as the JSON line carrying that nonce (None when
    there is none: timeout, crash, processes left behind). ``started``: the process, already
    started by ``start_harness`` with the same arguments (else it starts now)."""
    nonce, stdin = job_input(dict(job))
    if started is None:
        started = start_harness(
            module, cwd=cwd, timeout_s=timeout_s, env=env, gpu=gpu, writable=writable
        )
    result = started.finish(stdin)
    verdict = read_verdict(result, nonce, module.rsplit(".", 1)[-1])
    return (verdict if isinstance(verdict, dict) else None), result


@dataclass(eq=False)
class Prepared:
    """A process started ahead of its job (``start_harness``) in a fresh folder of the harness's,
    removed with it; a context manager that closes it."""

    started: Started
    folder: Path

    def close(self) -> None:
        """End the process if it is still waiting (a no-op once used) and remove its folder."""
        self.started.cancel()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Prepared:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _prepare(module: str, prefix: str, *, cwd: str = "", writable: tuple[str, ...] = (),
             **start: Any) -> Prepared:  # fmt: skip
    """``start_harness(module, ...)`` in a new temp folder (its subfolders ``cwd`` and ``writable``
    made first), the folder removed again when the start fails."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        for name in (cwd, *writable):
            (folder / name).mkdir(exist_ok=True)
        started = start_harness(
            module, cwd=folder / cwd, writable=tuple(folder / w for w in writable), **start
        )
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return Prepared(started, folder)


PER_EVALUATION_ENV = ("EVOLVE_SEED", "PYTHONHASHSEED")  # sent with the job, not at the start
# Timers kept waiting per key (device, timeout, environment): the driver they replace took ~10 s
# to start (imports) on the H200 host and an rmsnorm evaluation ~5 s, so one started when an
# evaluation begins was still importing when the next began (4.5 s of its wall time, measured
# on 2026-12-01); two ahead give each timer, and the candidate's process it starts, two
# evaluations' time.
AHEAD = 2
# per process, oldest first: (key, timer) pairs waiting for a later evaluation; a lock, as
# gpu_run evaluates on several GPUs from threads of one process
_WAITING: list[tuple[str, Prepared]] = []
MAX_WAITING_TIMERS = 16  # AHEAD per GPU of a large machine; each pair holds torch twice (~0.8 GB)
_NEXT_LOCK = threading.Lock()


def prepare_timer(device: str, timeout_s: float, env: Mapping[str, str]) -> Prepared:
    """A timer for ``device`` (its job's timeout ``timeout_s``) and ``env`` that waits for its job,
    with the candidate's process it started, in a folder with ``work/`` (the candidate's files
    are copied there when its evaluation begins) and ``harness/``.

    The per-evaluation variables (``PER_EVALUATION_ENV``) reach the candidate with the job; the
    hash seed of a process started ahead is therefore its own (random), not the evaluation's.
    """
    return _prepare(TIMER, "evolve-kernels-", cwd="work", writable=("harness",),
                    args=(device,), timeout_s=timeout_s, gpu=device.startswith("cuda"),
                    env={k: v for k, v in env.items() if k not in PER_EVALUATION_ENV})  # fmt: skip


def timer_key(device: str, timeout_s: float, env: Mapping[str, str]) -> str:
    """What a waiting timer must match to serve an evaluation: all but the per-evaluation variables."""
    spawn = sorted((k, v) for k, v in env.items() if k not in PER_EVALUATION_ENV)
    return json.dumps([device, timeout_s, spawn])


def take_timer(device: str, timeout_s: float, env: Mapping[str, str]) -> Prepared:
    """The oldest timer an earlier evaluation started for this key when it still waits, else a new one."""
    key = timer_key(device, timeout_s, env)
    while True:
        with _NEXT_LOCK:
            index = next((i for i, (k, _) in enumerate(_WAITING) if k == key), None)
            ready = None if index is None else _WAITING.pop(index)[1]
        if ready is None:
            return prepare_timer(device, timeout_s, env)
        if ready.started.alive():
            return ready
        ready.close()


def prepare_next_timer(device: str, timeout_s: float, env: Mapping[str, str]) -> None:
    """Start timers for the next evaluations with this device, timeout and environment until
    ``AHEAD`` wait for them; beyond ``MAX_WAITING_TIMERS`` in all, the oldest give way."""
    key = timer_key(device, timeout_s, env)
    with _NEXT_LOCK:
        missing = AHEAD - sum(k == key for k, _ in _WAITING)
    started = [prepare_timer(device, timeout_s, env) for _ in range(missing)]
    with _NEXT_LOCK:
        _WAITING.extend((key, timer) for timer in started)
        stale = [_WAITING.pop(0)[1] for _ in range(len(_WAITING) - MAX_WAITING_TIMERS)]
    for timer in stale:
        timer.close()


@atexit.register
def close_waiting_timers() -> None:
    """End the timers still waiting for an evaluation and remove their folders (at exit)."""
    with _NEXT_LOCK:
        waiting = [timer for _, timer in _WAITING]
        _WAITING.clear()
    for timer in waiting:
        timer.close()


def special_files(folder: str, names: list[str]) -> list[str]:
    """Names in ``folder`` that are neither files, folders nor links (a FIFO would block the copy)."""
    return [
        name
        for name in names
        if not (
            os.path.islink(p := os.path.join(folder, name)) or os.path.isfile(p) or os.path.isdir(p)
        )
    ]


def prepare_referee(device: str, timeout_s: float, env: Mapping[str, str]) -> Prepared:
    """A referee that waits for its task (``harness.referee_call``), in its folder."""
    return _prepare(REFEREE, "evolve-kernels-referee-", timeout_s=timeout_s, env=env,
                    gpu=device.startswith("cuda"))  # fmt: skip


def exit_now(code: int) -> NoReturn:
    """End this process at once, its answer already written: Python's teardown of torch's modules
    takes seconds that every evaluation would pay (2.6 s measured on the 2-core development
    machine). Only without child processes (e.g. a compile worker pool, or the candidate's
    process the timer ended), which a normal exit shuts down and the sandbox would otherwise
    count as left behind."""
    sys.stdout.flush()
    sys.stderr.flush()
    if _has_children():
        sys.exit(code)
    os._exit(code)


def _has_children() -> bool:
    """True when this process has a child, or when Linux cannot say (``/proc/.../children``)."""
    try:
        tasks = list(Path(f"/proc/{os.getpid()}/task").iterdir())
        return any((task / "children").read_text().split() for task in tasks)
    except OSError:
        return True
