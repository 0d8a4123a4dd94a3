"""The harness's evaluation process: it holds the targets, a child runs the model, cross-entropy by us.

Run by the harness as ``python -P -m evolve.benchmarks.speedrun.evaluate`` in a pristine
copy of the candidate's folder, inside the sandbox; on a GPU it is started while the
candidate trains (``scoring.start_evaluation``), so that its imports and its child's overlap
the training. It makes itself undumpable (the candidate, same user, can neither ptrace it
nor read its memory or file descriptors) and starts ``model_worker`` (which imports the
candidate's ``train`` once it has its spec) as a child that gets only input rows and writes
logits into a buffer shared with this process (CUDA IPC on a GPU, shared memory elsewhere).
Then it reads everything from stdin: one JSON line (the spec), then the input rows and the
target rows as uint16 - it is told no file path to them, nor which rows are scored and
which are probes (``scoring.py`` lays them out and checks the answers). For each checkpoint
it has the worker load it (comparing the initial one with ``torch.manual_seed(seed);
build_model()``), sends the rows batch by batch and computes the loss of every target from
the returned logits (over the real vocabulary: a padded model's extra columns are dropped);
it writes those losses and a summary (with the monotonic times its phases began) to the
``.npz`` named in the spec.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time

import numpy as np
import torch
from evolve.benchmarks.speedrun.model_worker import WORKER_ENV

from evolve.harness.lm import shared_logits, target_nats
from evolve.harness.protocol import SAFE_PATH, make_undumpable
from evolve.harness.reaper import kill_group


class ModelWorker:
    """The child running the candidate's model, its connection and the logits buffer it writes.

    Started first: it imports torch, then waits for ``begin`` (the buffer and the device)."""

    def __init__(self) -> None:
        self.memory_file = os.memfd_create("logits")  # the buffer on a CPU, sized by ``begin``
        self.conn, theirs = multiprocessing.Pipe()
        self.logits: torch.Tensor | None = None
        self.proc = subprocess.Popen(
            [sys.executable, *SAFE_PATH, "-m", "evolve.benchmarks.speedrun.model_worker"],
            stdin=subprocess.DEVNULL,
            stdout=sys.stderr,  # its output goes to the sandbox's log, never to a verdict
            env={**os.environ, WORKER_ENV: str(theirs.fileno())},
            start_new_session=True,
            pass_fds=(theirs.fileno(), self.memory_file),
        )
        theirs.close()

    def begin(self, shape: tuple[int, int, int], device: str) -> None:
        """Make the (batch, T, vocab) logits buffer on ``device`` and send the worker its spec."""
        self.logits, handle, _ = shared_logits(shape, device, self.memory_file)
        self.ask({"logits": handle, "device": device})

    def ask(self, request: dict, payload: bytes | None = None) -> dict:
        """Send one request (and its rows); the worker's answer."""
        try:
            self.conn.send_bytes(json.dumps(request).encode())
            if payload is not None:
                self.conn.send_bytes(payload)
            return json.loads(self.conn.recv_bytes())
        except (EOFError, OSError) as exc:
            kill_group(self.proc)
            raise SystemExit("the model worker stopped answering; its output is above") from exc

    def run(self, inputs: np.ndarray) -> torch.Tensor:
        """The model's logits (rows, T, vocab) for ``inputs``, copied out of the shared buffer."""
        self.ask({"rows": len(inputs)}, inputs.astype(np.int32).tobytes())
        logits = self.logits[: len(inputs)].clone()
        if logits.is_cuda:
            torch.cuda.synchronize()  # copied before the worker may write the buffer again
        return logits

    def close(self) -> None:
        self.conn.close()
        kill_group(self.proc)


def evaluate(worker: ModelWorker, spec: dict, inputs: np.ndarray, targets: np.ndarray) -> dict:
    """Evaluate every checkpoint named in ``spec`` on its rows; return arrays for the .npz.

    The summary's ``marks`` are (phase, monotonic time) pairs: where the worker's start,
    each checkpoint's load and each one's forward passes began, and the end."""
    device = "cuda" if torch.cuda.is_available() and spec.get("device", "cuda") == "cuda" else "cpu"
    batch, seq = spec["batch_size"], inputs.shape[1]
    out: dict[str, np.ndarray] = {}
    summary: dict = {"marks": [("scoring_worker", time.monotonic())]}
    worker.begin((batch, seq, spec["vocab_size"]), device)
    for ckpt in spec["checkpoints"]:
        summary["marks"].append(("scoring_load", time.monotonic()))
        request = {"load": ckpt["path"]}
        if "reference" in ckpt:
            request["reference"] = int(ckpt["reference"])
        answer = worker.ask(request)
        info = {"params": int(answer["params"])}
        if "reference" in ckpt:
            info["reference_diff"] = str(answer.get("reference_diff", ""))
        summary["marks"].append(("scoring_forward", time.monotonic()))
        rows = np.asarray(ckpt["rows"], dtype=np.int64)
        nats = torch.empty((len(rows), seq), dtype=torch.float32)
        for first in range(0, len(rows), batch):
            chosen = rows[first : first + batch]
            logits = worker.run(inputs[chosen])
            y = torch.from_numpy(targets[chosen].astype(np.int64)).to(logits.device)
            nats[first : first + len(chosen)] = target_nats(logits, y).cpu()
        out[f"nats_{ckpt['name']}"] = nats.numpy()
        summary[ckpt["name"]] = info
    summary["marks"].append(("scoring_exit", time.monotonic()))
    out["summary"] = np.frombuffer(json.dumps(summary).encode(), dtype=np.uint8)
    return out


def main() -> None:
    make_undumpable()
    worker = ModelWorker()  # imports torch while this process waits for its job
    try:
        # all of it first: nothing is printed while the harness writes
        raw = sys.stdin.buffer.read()
        newline = raw.index(b"\n")
        spec = json.loads(raw[:newline])
        rows, seq = spec["shape"]
        tokens = np.frombuffer(raw[newline + 1 :], dtype="<u2").reshape(2, rows, seq)
        arrays = evaluate(worker, spec, tokens[0], tokens[1])
    finally:
        worker.close()
    np.savez(spec["out"], **arrays)


if __name__ == "__main__":
    main()
