"""The harness's process of the local check: the candidate's fresh model on fixed training rows.

First launches ``probe_worker``, the guarded child that will run the candidate's code (it
imports torch while this process does, then waits for its spec), then reads its job (one
JSON line) from stdin. Takes the first packed rows of the training split as fixed inputs,
makes a probe batch of them (``evolve.harness.lm.make_probes``: some rows get another future
at cuts drawn from this process's secret randomness, all rows shuffled), and sends the
worker its spec; the worker returns the fresh model's logits for both batches through
shared memory, again with its weights perturbed (zero-initialised layers come alive, as
training will make them), and its gradient norms on a pipe. This process never imports
candidate code: it
computes the loss, log-probabilities and the causality number from the logits itself and
prints them as one JSON line carrying the job's nonce (the child's output goes to a log
file, and this process is undumpable). The harness's fitness compares them with the seed's
(``evolve.benchmarks.nanochat.layered``).
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import secrets
import select
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evolve.harness.clock import GO_FD_ENV, LEFTOVER_GRACE_S
from evolve.harness.confine import hide_reads
from evolve.harness.protocol import SAFE_PATH, EvalFailure, serve_job, tail
from evolve.harness.reaper import kill_group, reap_tree

from .client import CONFIG_KEYS
from .probe_worker import OUTPUTS, PROBE_ENV
from .supervisor import TRAIN_DIR_ENV, TREE_ENV, program_env

LOG_FILE = "probe.log"
ROWS = 4  # rows of each batch: the probe batch gives two of them another future
SPARE = 2  # further rows whose tokens make those futures
SLICE = (16, 64)  # the log-probabilities reported: 16 positions spread over the row, 64 tokens


def _answer(answer_fd: int, report_fd: int, limit_s: float) -> dict:
    """The child's one JSON line (or its failure), and no forbidden access reported meanwhile."""
    deadline, buffer = time.monotonic() + limit_s, b""
    while b"\n" not in buffer:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([answer_fd], [], [], remaining)[0]:
            raise EvalFailure("timeout", f"the model was not built and run within {limit_s:.0f}s")
        chunk = os.read(answer_fd, 1 << 16)
        if not chunk:
            break
        buffer = (buffer + chunk)[-(1 << 20) :]
    while select.select([report_fd], [], [], 0)[0]:
        chunk = os.read(report_fd, 1 << 16)
        if not chunk:
            break
        if b"violation " in chunk:
            raise EvalFailure(
                "rejected", f"read forbidden data: {chunk.decode(errors='replace')[:300]}"
            )
    if b"\n" not in buffer:
        raise EvalFailure(
            "error", "the probe's worker exited without an answer:\n" + tail(LOG_FILE)
        )
    try:
        message = json.loads(buffer.split(b"\n", 1)[0])
    except ValueError as exc:
        raise EvalFailure("error", "the probe's worker answered garbage") from exc
    if not isinstance(message, dict) or "error" in message:
        error = message.get("error") if isinstance(message, dict) else message
        raise EvalFailure("error", f"{str(error)[:2000]}\n{tail(LOG_FILE, 2000)}")
    return message


def _number(message: dict, key: str) -> float:
    value = message.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EvalFailure("error", f"the probe's worker gave no number {key!r}")
    return float(value)


@dataclass
class Worker:
    """The child that runs candidate code, launched with this process (``start_worker``): it
    imports torch while this process imports and waits for its job, then waits for its spec."""

    proc: subprocess.Popen
    tag: str
    spec_w: int
    answer_r: int
    report_r: int
    io_fd: int
    launched: float


def start_worker() -> Worker:
    """Launch the worker before the job, with the training split (``TRAIN_DIR_ENV``, set by the
    fitness) hidden from it from the start (Landlock, native code included)."""
    answer_r, answer_w = os.pipe()
    report_r, report_w = os.pipe()
    spec_r, spec_w = os.pipe()
    io_fd = os.memfd_create("nanochat-probe")  # the rows in, the logits out; sized with the job
    tag = uuid.uuid4().hex
    fds = {"answer_fd": answer_w, "report_fd": report_w, "io_fd": io_fd}
    env = program_env() | {TREE_ENV: tag, PROBE_ENV: json.dumps(fds), GO_FD_ENV: str(spec_r)}
    launched = time.monotonic()
    with open(LOG_FILE, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, *SAFE_PATH, "-m", "evolve.benchmarks.nanochat.probe_worker"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            pass_fds=(answer_w, report_w, io_fd, spec_r),
            start_new_session=True,
            preexec_fn=hide_reads([os.environ[TRAIN_DIR_ENV]]),
        )
    for fd in (answer_w, report_w, spec_r):
        os.close(fd)
    return Worker(proc, tag, spec_w, answer_r, report_r, io_fd, launched)


def run_model(job: dict, inputs: np.ndarray, worker: Worker) -> tuple[dict, np.ndarray, dict]:
    """Have ``worker`` run the candidate's model on ``inputs`` (2 batches of rows); its answer,
    the logits (copied out) and the monotonic times it was launched and answered (``marks``:
    phases of the evaluation)."""
    if job["train_dir"] != os.environ[TRAIN_DIR_ENV]:
        raise EvalFailure("error", "the job's training split is not the one hidden from the worker")
    seq, vocab = job["seq_len"], job["vocab_size"]
    in_bytes = inputs.size * 4
    size = in_bytes + OUTPUTS * ROWS * seq * vocab * 4
    os.ftruncate(worker.io_fd, size)
    io = mmap.mmap(worker.io_fd, size)
    io[:in_bytes] = inputs.astype(np.int32).tobytes()
    spec = {
        "io_bytes": size,
        "rows": ROWS,
        "seq_len": seq,
        "vocab_size": vocab,
        "device": job["device"],
        "entry": job["entry"],
        "perturb_seed": secrets.randbits(63),
        "config": {k: job[k] for k in CONFIG_KEYS}
        | {"forbidden": [*job["forbidden"], job["train_dir"]]},
    }
    try:
        with contextlib.suppress(BrokenPipeError):  # it died waiting: its answer says so
            os.write(worker.spec_w, (json.dumps(spec) + "\n").encode())
        os.close(worker.spec_w)
        message = _answer(worker.answer_r, worker.report_r, job["limit_s"])
        answered = time.monotonic()
    finally:
        kill_group(worker.proc)
        leftover = reap_tree(f"{TREE_ENV}={worker.tag}".encode(), LEFTOVER_GRACE_S)
    if leftover:
        raise EvalFailure(
            "rejected",
            f"the training program left {len(leftover)} process(es) running (killed): "
            + "; ".join(leftover[:3]),
        )
    # Our own copy: the child can no longer change it.
    logits = (
        np.frombuffer(io, dtype=np.float32, offset=in_bytes)
        .reshape(OUTPUTS, ROWS, seq, vocab)
        .copy()
    )
    return message, logits, {"worker": worker.launched, "answered": answered}


def probe(job: dict, worker: Worker) -> dict:
    """The named values of the candidate's fresh model on the fixed rows; raises EvalFailure."""
    import torch  # here, not at the top: this process imports it while its worker does

    from evolve.harness.lm import make_probes, probe_diffs

    from .scorer import eval_rows

    seq = job["seq_len"]
    rows = eval_rows(Path(job["train_dir"]), seq, ROWS, spare=SPARE)
    first = rows[:ROWS]
    rng = np.random.default_rng(secrets.randbits(128))
    probe_batch = make_probes([first], rows[ROWS:], 1, rng)[0]
    message, logits, marks = run_model(job, np.stack([first, probe_batch.rows]), worker)
    logits = torch.from_numpy(logits)
    log_probs = torch.log_softmax(logits[0], dim=-1)
    targets = torch.from_numpy(first[:, 1:]).unsqueeze(-1)
    positions, tokens = SLICE
    # as built, and perturbed: both must be causal and keep rows independent
    causality = max(
        max(probe_diffs(logits[i], logits[i + 1], probe_batch)) for i in range(0, OUTPUTS, 2)
    )
    values = {
        "loss": float(-log_probs.gather(-1, targets).mean()),
        "log_probs": log_probs[:, :: max(1, seq // positions)][:, :positions, :tokens].tolist(),
        "grad_norm_vocab": _number(message, "grad_norm_vocab"),
        "grad_norm_body": _number(message, "grad_norm_body"),
        "causality": causality,
    }
    return {"values": values, "params": _number(message, "params"), "config": message.get("config"),
            "marks": marks}  # fmt: skip


def answer(job: dict, worker: Worker) -> dict:
    """The probe's verdict on ``job``: the values, or the failure; the worker's log either way."""
    try:
        result = {"status": "ok", **probe(job, worker)}
    except EvalFailure as failure:
        result = {"status": failure.status, "reason": failure.reason}
    return result | {"log_tail": tail(LOG_FILE, 1500)}


if __name__ == "__main__":
    launched = start_worker()  # before this process's own imports: the two overlap
    serve_job(lambda job: answer(job, launched))
