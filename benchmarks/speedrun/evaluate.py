"""The harness's evaluation process: it holds the targets, runs the exported model, computes cross-entropy itself.

Run by the harness as ``python -P -m evolve.benchmarks.speedrun.evaluate`` inside the sandbox;
on a GPU it is started while the candidate trains (``scoring.start_evaluation``), so that its
imports and its CUDA context overlap the training. It makes itself undumpable and runs no candidate code: its
read-only input folder holds the checkpoints the harness verified and the graph that
``evolve.harness.exporter`` made of the candidate's model in a sandbox of its own after the
stop. ``evolve.harness.exported.Program`` screens and checks that graph and binds it to each
checkpoint's own tensors in turn, so every score is of a pure function of the input tokens.
It reads everything from stdin: one JSON line (the spec), then the input rows and the target
rows as uint16; it is told no file path to them, nor which rows are scored and which are
probes (``scoring.py`` lays them out and checks the answers). It computes the loss of every
target from the logits (over the real vocabulary) and writes those losses and a summary (with
the monotonic times its phases began, or the reason the model cannot be scored) to the
``.npz`` named in the spec.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from evolve.harness.exported import ExportRejected, Program, load_weights
from evolve.harness.lm import target_nats
from evolve.harness.protocol import make_undumpable


def logits_of(model: torch.nn.Module, inputs: np.ndarray, batch: int, device: str) -> torch.Tensor:
    """The model's logits for up to ``batch`` rows of ``inputs``, padded to the exported batch
    shape with copies of the first row (rows are independent: the probes check it)."""
    padded = np.concatenate([inputs, np.repeat(inputs[:1], batch - len(inputs), axis=0)])
    x = torch.from_numpy(padded.astype(np.int64)).to(device)
    return model(x)[: len(inputs)]


def evaluate(spec: dict, inputs: np.ndarray, targets: np.ndarray) -> dict:
    """Evaluate every checkpoint named in ``spec`` on its rows; return arrays for the .npz.

    The summary's ``marks`` are (phase, monotonic time) pairs: where each checkpoint's load
    and each one's forward passes began, and the end."""
    device = "cuda" if torch.cuda.is_available() and spec.get("device", "cuda") == "cuda" else "cpu"
    batch, seq = spec["batch_size"], inputs.shape[1]
    out: dict[str, np.ndarray] = {}
    summary: dict = {"marks": []}
    try:
        program = Program(
            Path(spec["graph"]), rows=batch, seq=seq, vocab=spec["vocab_size"], device=device
        )
        with torch.inference_mode():
            for ckpt in spec["checkpoints"]:
                summary["marks"].append(("scoring_load", time.monotonic()))
                weights = load_weights(Path(ckpt["path"]))
                model = program.bind(weights)
                summary[ckpt["name"]] = {"params": int(sum(t.numel() for t in weights.values()))}
                del weights
                summary["marks"].append(("scoring_forward", time.monotonic()))
                rows = np.asarray(ckpt["rows"], dtype=np.int64)
                nats = torch.empty((len(rows), seq), dtype=torch.float32)
                for first in range(0, len(rows), batch):
                    chosen = rows[first : first + batch]
                    logits = logits_of(model, inputs[chosen], batch, device)
                    y = torch.from_numpy(targets[chosen].astype(np.int64)).to(logits.device)
                    nats[first : first + len(chosen)] = target_nats(logits, y).cpu()
                out[f"nats_{ckpt['name']}"] = nats.numpy()
    except ExportRejected as exc:
        summary["rejected"] = str(exc)
    summary["marks"].append(("scoring_exit", time.monotonic()))
    out["summary"] = np.frombuffer(json.dumps(summary).encode(), dtype=np.uint8)
    return out


def main() -> None:
    make_undumpable()
    if torch.cuda.is_available():  # the GPU's context made while the candidate trains, not after
        torch.empty(0, device="cuda")
    # all of it first: nothing is printed while the harness writes
    raw = sys.stdin.buffer.read()
    newline = raw.index(b"\n")
    spec = json.loads(raw[:newline])
    rows, seq = spec["shape"]
    tokens = np.frombuffer(raw[newline + 1 :], dtype="<u2").reshape(2, rows, seq)
    np.savez(spec["out"], **evaluate(spec, tokens[0], tokens[1]))


if __name__ == "__main__":
    main()
