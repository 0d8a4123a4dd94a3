"""The harness's process in the training sandbox: runs the candidate under the harness clock and feeds it data.

Reads its job (JSON) from stdin, then runs the candidate's training script under the guard
as a child through ``evolve.harness.clock.run_timed``: synthetic rows until the clock
starts, the training split's BOS-aligned best-fit packed rows while it runs, none after the
stop. When the candidate reports its checkpoint, this process fixes the checkpoint's digest
(the fitness scores only those bytes), after checking that the report came no later than the
step in flight and the write allow (``evolve.harness.savetime``). While the clock runs it
writes the steps and loss its clock took in, at most once a second (``Progress``), for the
log; when the program reports its initial checkpoint before the clock starts
(``client.save_initial``), it writes that checkpoint's digest (``say_initial``), for the
fitness to export the model while it trains; the verdict is one JSON line on stdout carrying
the job's nonce. With ``--ahead`` it launches that child before reading its job: the guard
imports torch, then waits for the go this process gives it with the job.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from evolve.harness.clock import UNTIMED_ENV, Program, Window, launch, run_timed
from evolve.harness.confine import hide_reads
from evolve.harness.hashing import files_digest
from evolve.harness.profiling import PROFILE_ENV
from evolve.harness.protocol import SAFE_PATH, say_progress, serve_job

from .client import CHECKPOINT_FILES, CONFIG_ENV, CONFIG_KEYS
from .guard import WAIT
from .packing import pack_rows
from .tokens import Split

LOG_FILE = "train.log"
AHEAD = "--ahead"  # launch the training program before the job arrives (``launch_ahead``)
TRAIN_DIR_ENV = "NANOCHAT_TRAIN_DIR"  # the training split's folder, for a program launched ahead
TREE_ENV = "NANOCHAT_TREE"  # marks every process the training program starts
PROGRESS_EVERY_S = 1.0  # at most one progress line a second (600 s of training: ~30 KB of stdout)
INITIAL = "initial"
"""An initial-checkpoint line's key: ``{"initial": {"digest": SHA256}}``."""
COMPILE_WORKERS = (
    "compile_worker",
)  # torch.compile's pool may take a moment to exit: not held against


def is_checkpoint_name(name: str) -> bool:
    """Whether a checkpoint file of this name is read: model.py and other .py files, config.json, model.pt."""
    return name.endswith(".py") or name in CHECKPOINT_FILES


def checkpoint_files(folder: Path) -> list[Path]:
    """The checkpoint's files that the scorer reads (``is_checkpoint_name``)."""
    if not folder.is_dir():
        return []
    return sorted(
        p
        for p in folder.iterdir()
        if p.is_file() and not p.is_symlink() and is_checkpoint_name(p.name)
    )


def checkpoint_bytes(folder: Path) -> int:
    """The size of the checkpoint's files: what its save wrote."""
    return sum(p.stat().st_size for p in checkpoint_files(folder))


def checkpoint_digest(folder: Path) -> str:
    """SHA-256 over the checkpoint's files (names and bytes)."""
    return files_digest(checkpoint_files(folder), root=folder)


def say_initial(folder: Path) -> None:
    """Write the initial checkpoint's line on stdout: the digest of the files in ``folder`` now."""
    sys.stdout.write(json.dumps({INITIAL: {"digest": checkpoint_digest(folder)}}) + "\n")
    sys.stdout.flush()


def initial_digest(line: str) -> str | None:
    """The digest an initial-checkpoint line (``say_initial``) carries, or None for any other line."""
    if not line.startswith('{"' + INITIAL):
        return None
    try:
        digest = json.loads(line)[INITIAL]["digest"]
    except (ValueError, TypeError, KeyError):
        return None
    return digest if isinstance(digest, str) else None


class Rows:
    """The feed: synthetic rows of the same shape before the clock, packed training rows while it runs."""

    def __init__(self, job: dict) -> None:
        self.width = job["seq_len"] + 1
        self.vocab, self.bos = job["vocab_size"], job["bos_id"]
        self.rng = np.random.default_rng(job["seed"])
        self.noise = np.random.default_rng(secrets.randbits(64))
        self.real = pack_rows(self._documents(Split(Path(job["train_dir"]))), self.width)

    def _documents(self, split: Split) -> Iterator[np.ndarray]:
        while True:
            yield from split.documents(self.rng.permutation(len(split)))

    def __call__(self, rows: int, real: bool) -> np.ndarray:
        if real:
            return np.stack([next(self.real) for _ in range(rows)])
        batch = self.noise.integers(0, self.vocab, size=(rows, self.width), dtype=np.int32)
        batch[:, 0] = self.bos
        return batch


def guard_command(*args: str) -> list[str]:
    return [sys.executable, *SAFE_PATH, "-m", "evolve.benchmarks.nanochat.guard", *args]


def launch_ahead() -> Program:
    """The training program launched before the job (``--ahead``): the guard imports torch and
    then waits for ``supervise``'s go; the training split (``TRAIN_DIR_ENV``) is
    hidden from it from the start, as from a program launched with its job."""
    return launch(guard_command(WAIT), env=program_env(), log_file=LOG_FILE, marker_var=TREE_ENV,
                  preexec=hide_reads([os.environ[TRAIN_DIR_ENV]]), waits=True)  # fmt: skip


def program_env() -> dict[str, str]:
    """This process's environment for the training program, less ``TRAIN_DIR_ENV`` (a harness
    variable; the program's settings name the split only among the paths its guard refuses)."""
    return {k: v for k, v in os.environ.items() if k != TRAIN_DIR_ENV}


class Progress:
    """Tells the fitness how training goes (``protocol.say_progress``), at most every ``PROGRESS_EVERY_S``."""

    def __init__(self) -> None:
        self.said_at = -math.inf

    def __call__(self, steps: int, loss: float | None) -> None:
        now = time.monotonic()
        if now >= self.said_at + PROGRESS_EVERY_S:
            self.said_at = now
            say_progress(steps, loss)


def supervise(job: dict, ahead: Program | None = None) -> dict:
    """Run the candidate per ``job`` and return the verdict (without the nonce); ``ahead``: its
    program, launched before the job (``launch_ahead``)."""
    folder, initial = Path(job["checkpoint_dir"]), Path(job["initial_dir"])
    # The training split reaches the program only through the feed: its files are forbidden too.
    config = {k: job[k] for k in CONFIG_KEYS} | {"forbidden": [*job["forbidden"], job["train_dir"]]}
    variables = {CONFIG_ENV: json.dumps(config), UNTIMED_ENV: str(job["untimed_steps"])}
    if job.get("profile"):  # first step and count of the steps profiled for feedback
        variables[PROFILE_ENV] = " ".join(str(int(v)) for v in job["profile"])
    short = job.get("max_steps") is not None  # a short run ends at its steps, not by the budget
    window = Window(
        budget_s=job["budget_s"] + (job["startup_limit_s"] if short else 0.0),
        untimed_steps=job["untimed_steps"],
        startup_limit_s=job["startup_limit_s"],
        free_startup_s=job["free_startup_s"],
        finish_limit_s=job["finish_limit_s"],
        save_floor_s=job["save_floor_s"],
        max_steps=job.get("max_steps"),
        profiled=bool(job.get("profile")),
    )
    if ahead is not None and os.environ.get(TRAIN_DIR_ENV) == job["train_dir"]:
        ahead.go({"argv": [job["entry"]], "env": variables})
        program = ahead
    else:
        if ahead is not None:
            ahead.cancel()
        program = launch(
            guard_command(job["entry"]),
            env={**program_env(), **variables},
            log_file=LOG_FILE,
            marker_var=TREE_ENV,
            preexec=hide_reads([job["train_dir"]]),  # native code included, where Landlock is
        )
    return run_timed(
        program,
        window=window,
        feed=Rows(job),
        on_saved=lambda: {"digest": checkpoint_digest(folder), "bytes": checkpoint_bytes(folder)},
        ignore_leftovers=COMPILE_WORKERS,
        write_dir=str(folder.parent),
        progress=Progress(),
        on_initial=lambda: say_initial(initial),
    )


if __name__ == "__main__":
    launched = launch_ahead() if AHEAD in sys.argv[1:] else None
    serve_job(lambda job: supervise(job, launched))
