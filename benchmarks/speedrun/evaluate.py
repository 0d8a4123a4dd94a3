"""The harness's evaluation process: it holds the targets, a child runs the model, cross-entropy by us.

Run by the harness as ``python -P -m evolve.benchmarks.speedrun.evaluate`` in a pristine
copy of the candidate's folder, inside the sandbox, after training has ended. It reads everything from stdin: one JSON line
(the spec), then the input rows and the target rows as uint16 - it is told no file path to
them, nor which rows are scored and which are probes (``scoring.py`` lays them out and
checks the answers). It never imports candidate code: it makes itself undumpable (the
candidate, same user, can neither ptrace it nor read its memory or file descriptors) and
starts ``model_worker`` (which imports the candidate's ``train``) as a child that gets only
input rows and writes logits into a buffer shared with this process (CUDA IPC on a GPU,
shared memory elsewhere). For each checkpoint it has the worker load it (comparing the
initial one with ``torch.manual_seed(seed); build_model()``), sends the rows batch by batch
and computes the loss of every target from the returned logits (over the real vocabulary: a
padded model's extra columns are dropped); it writes those losses and a summary to the
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
    """The child running the candidate's model, its connection and the logits buffer it writes."""

    def __init__(self, shape: tuple[int, int, int], device: str) -> None:
        self.logits, handle, fds = shared_logits(shape, device)
        self.conn, theirs = multiprocessing.Pipe()
        spec = {"fd": theirs.fileno(), "logits": handle, "device": device}
        self.proc = subprocess.Popen(
            [sys.executable, *SAFE_PATH, "-m", "evolve.benchmarks.speedrun.model_worker"],
            stdin=subprocess.DEVNULL,
            stdout=sys.stderr,  # its output goes to the sandbox's log, never to a verdict
            env={**os.environ, WORKER_ENV: json.dumps(spec)},
            start_new_session=True,
            pass_fds=(theirs.fileno(), *fds),
        )
        theirs.close()

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


def evaluate(spec: dict, inputs: np.ndarray, targets: np.ndarray) -> dict:
    """Evaluate every checkpoint named in ``spec`` on its rows; return arrays for the .npz."""
    device = "cuda" if torch.cuda.is_available() and spec.get("device", "cuda") == "cuda" else "cpu"
    batch, seq = spec["batch_size"], inputs.shape[1]
    out: dict[str, np.ndarray] = {}
    summary: dict[str, dict] = {}
    worker = ModelWorker((batch, seq, spec["vocab_size"]), device)
    try:
        for ckpt in spec["checkpoints"]:
            begin = time.monotonic()
            state = torch.load(ckpt["path"], map_location="cpu", weights_only=True)
            info: dict = {"params": int(sum(t.numel() for t in state.values()))}
            del state
            if "reference" in ckpt:
                answer = worker.ask({"load": ckpt["path"], "reference": int(ckpt["reference"])})
                info["reference_diff"] = str(answer.get("reference_diff", ""))
            else:
                worker.ask({"load": ckpt["path"]})
            rows = np.asarray(ckpt["rows"], dtype=np.int64)
            nats = torch.empty((len(rows), seq), dtype=torch.float32)
            for first in range(0, len(rows), batch):
                chosen = rows[first : first + batch]
                logits = worker.run(inputs[chosen])
                y = torch.from_numpy(targets[chosen].astype(np.int64)).to(logits.device)
                nats[first : first + len(chosen)] = target_nats(logits, y).cpu()
            out[f"nats_{ckpt['name']}"] = nats.numpy()
            summary[ckpt["name"]] = {**info, "seconds": time.monotonic() - begin}
    finally:
        worker.close()
    out["summary"] = np.frombuffer(json.dumps(summary).encode(), dtype=np.uint8)
    return out


def main() -> None:
    make_undumpable()
    raw = sys.stdin.buffer.read()  # all of it first: nothing is printed while the harness writes
    newline = raw.index(b"\n")
    spec = json.loads(raw[:newline])
    rows, seq = spec["shape"]
    tokens = np.frombuffer(raw[newline + 1 :], dtype="<u2").reshape(2, rows, seq)
    arrays = evaluate(spec, tokens[0], tokens[1])
    np.savez(spec["out"], **arrays)


if __name__ == "__main__":
    main()
