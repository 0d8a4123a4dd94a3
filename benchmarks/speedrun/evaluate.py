"""The harness's evaluation process: candidate logits on the harness's rows, cross-entropy by us.

Run by the harness as ``python evaluate.py`` in a pristine copy of the candidate's folder
(so ``import train`` finds the candidate's model), inside the sandbox, after training has
ended. It reads everything from stdin: one JSON line (the spec), then the input rows and
the target rows as uint16 - it is told no file path to them, nor which rows are scored and
which are probes (``scoring.py`` lays them out and checks the answers). It binds the
functions it computes with before importing candidate code, builds the model with
``train.build_model()``, compares the initial checkpoint with the model that
``torch.manual_seed(seed); build_model()`` gives, loads each checkpoint and writes the loss
of every target and a few full logit rows (for the harness to recompute in numpy) to the
``.npz`` named in the spec.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time

import numpy as np
import torch

LOGSUMEXP = torch.logsumexp
GATHER = torch.gather
FLOAT32 = torch.float32


def _nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = logits.to(FLOAT32)
    return LOGSUMEXP(logits, dim=-1) - GATHER(logits, -1, targets.unsqueeze(-1)).squeeze(-1)


def _forward(model: torch.nn.Module, x: torch.Tensor, vocab_size: int, device: str) -> torch.Tensor:
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        logits = model(x)
    if (
        not isinstance(logits, torch.Tensor)
        or logits.shape[:2] != x.shape
        or logits.shape[-1] < vocab_size
    ):
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise SystemExit(
            f"model(idx) must return logits of shape (batch, seq, >= {vocab_size}) for idx of shape "
            f"{tuple(x.shape)}; got {shape}"
        )
    return logits


def _reference_diff(state: dict, seed: int) -> str:
    """Where ``state`` differs from ``torch.manual_seed(seed); build_model()``; "" when it does not."""
    import train

    torch.manual_seed(seed)
    reference = train.build_model().state_dict()
    if sorted(reference) != sorted(state):
        return f"its tensors are {sorted(state)[:5]}..., build_model() gives {sorted(reference)[:5]}..."
    for name, tensor in reference.items():
        got = state[name]
        if got.shape != tensor.shape or not torch.equal(got, tensor.to(got.dtype)):
            return f"first difference in {name!r}"
    return ""


def evaluate(spec: dict, inputs: np.ndarray, targets: np.ndarray) -> dict:
    """Evaluate every checkpoint named in ``spec`` on its rows; return arrays for the .npz.

    Each batch runs on a fresh copy of the loaded model, so nothing a forward pass keeps
    on the model carries over to the next.
    """
    sys.path.insert(0, os.getcwd())
    import train  # the candidate's program; its __main__ block does not run

    device = "cuda" if torch.cuda.is_available() and spec.get("device", "cuda") == "cuda" else "cpu"
    vocab, batch = spec["vocab_size"], spec["batch_size"]
    out: dict[str, np.ndarray] = {}
    summary: dict[str, dict] = {}
    for ckpt in spec["checkpoints"]:
        begin = time.monotonic()
        state = torch.load(ckpt["path"], map_location="cpu", weights_only=True)
        info: dict = {"params": int(sum(t.numel() for t in state.values()))}
        if "reference" in ckpt:
            info["reference_diff"] = _reference_diff(state, int(ckpt["reference"]))
        model = train.build_model()
        model.load_state_dict(state, strict=True)
        model = model.to(device).eval()
        rows = np.asarray(ckpt["rows"], dtype=np.int64)
        nats = torch.empty((len(rows), inputs.shape[1]), dtype=FLOAT32)
        spots = {}
        for row, position in ckpt.get("spots", []):
            spots.setdefault(row, []).append(position)
        logit_rows = {}
        with torch.no_grad():
            for first in range(0, len(rows), batch):
                chosen = rows[first : first + batch]
                x = torch.from_numpy(inputs[chosen].astype(np.int64)).to(device)
                y = torch.from_numpy(targets[chosen].astype(np.int64)).to(device)
                logits = _forward(copy.deepcopy(model), x, vocab, device)
                nats[first : first + len(chosen)] = _nll(logits, y).cpu()
                for i, row in enumerate(chosen.tolist()):
                    for position in spots.get(row, []):
                        logit_rows[(row, position)] = logits[i, position].to(FLOAT32).cpu().numpy()
        out[f"nats_{ckpt['name']}"] = nats.numpy()
        if spots:
            out[f"spot_logits_{ckpt['name']}"] = np.stack(
                [logit_rows[(row, position)] for row, position in ckpt["spots"]]
            )
        summary[ckpt["name"]] = {**info, "seconds": time.monotonic() - begin}
        del model, state
    out["summary"] = np.frombuffer(json.dumps(summary).encode(), dtype=np.uint8)
    return out


def main() -> None:
    raw = sys.stdin.buffer.read()  # all of it first: nothing is printed while the harness writes
    newline = raw.index(b"\n")
    spec = json.loads(raw[:newline])
    rows, seq = spec["shape"]
    tokens = np.frombuffer(raw[newline + 1 :], dtype="<u2").reshape(2, rows, seq)
    torch.manual_seed(0)
    arrays = evaluate(spec, tokens[0], tokens[1])
    np.savez(spec["out"], **arrays)


if __name__ == "__main__":
    main()
