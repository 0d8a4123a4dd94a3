"""The harness's evaluation process: candidate logits on validation tokens, cross-entropy by us.

Run by the harness as ``python evaluate.py`` in the candidate's folder (so ``import
train`` finds the candidate's model), inside the sandbox, after training has ended. It
reads everything from stdin: one JSON line (the spec) then the validation tokens as
uint16 - it is told no file path to them. It binds the functions it computes with
before importing candidate code, builds the model with ``train.build_model()``, loads
each checkpoint, checks causality (changing later tokens must not change earlier
logits), and writes per-position losses and a few full logit rows (for the harness to
recompute in numpy) to the ``.npz`` named in the spec. The mean is taken by the harness.
"""

from __future__ import annotations

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


def _causality(model: torch.nn.Module, x: torch.Tensor, vocab_size: int, device: str) -> float:
    """Largest change of logits before position k when the tokens from k on are replaced."""
    row = x[:1]
    k = row.shape[1] // 2
    changed = row.clone()
    generator = torch.Generator().manual_seed(0)
    changed[0, k:] = torch.randint(0, vocab_size, (row.shape[1] - k,), generator=generator).to(
        row.device
    )
    a = _forward(model, row, vocab_size, device)[0, :k].to(FLOAT32)
    b = _forward(model, changed, vocab_size, device)[0, :k].to(FLOAT32)
    return float((a - b).abs().max() / max(1.0, float(a.abs().max())))


def evaluate(spec: dict, tokens: np.ndarray) -> dict:
    """Evaluate every checkpoint named in ``spec``; return arrays for the .npz."""
    sys.path.insert(0, os.getcwd())
    import train  # the candidate's program; its __main__ block does not run

    device = "cuda" if torch.cuda.is_available() and spec.get("device", "cuda") == "cuda" else "cpu"
    vocab, seq, batch = spec["vocab_size"], spec["seq_len"], spec["batch_size"]
    out: dict[str, np.ndarray] = {}
    summary: dict[str, dict] = {}
    for ckpt in spec["checkpoints"]:
        begin = time.monotonic()
        model = train.build_model()
        state = torch.load(ckpt["path"], map_location="cpu", weights_only=True)
        model.load_state_dict(state, strict=True)
        model = model.to(device).eval()
        n = int(ckpt["tokens"])
        stream = torch.from_numpy(tokens[: n + 1].astype(np.int64))
        losses = torch.empty(n, dtype=FLOAT32)
        spot = [p for p in spec.get("spot", []) if p < n] if ckpt.get("spot") else []
        rows = []
        causal = None
        with torch.no_grad():
            for first in range(0, n, batch * seq):
                count = min(batch * seq, n - first)
                x = stream[first : first + count].view(-1, seq).to(device)
                y = stream[first + 1 : first + count + 1].view(-1, seq).to(device)
                logits = _forward(model, x, vocab, device)
                if causal is None and ckpt.get("causal"):
                    causal = _causality(model, x, vocab, device)
                losses[first : first + count] = _nll(logits, y).reshape(-1).cpu()
                for p in spot:
                    if first <= p < first + count:
                        rows.append(logits.reshape(count, -1)[p - first].to(FLOAT32).cpu().numpy())
        out[f"losses_{ckpt['name']}"] = losses.numpy()
        if spot:
            out[f"spot_positions_{ckpt['name']}"] = np.asarray(spot, dtype=np.int64)
            out[f"spot_logits_{ckpt['name']}"] = np.stack(rows)
        summary[ckpt["name"]] = {
            "params": int(sum(t.numel() for t in state.values())),
            "causal_diff": causal,
            "seconds": time.monotonic() - begin,
        }
        del model, state
    out["summary"] = np.frombuffer(json.dumps(summary).encode(), dtype=np.uint8)
    return out


def main() -> None:
    raw = sys.stdin.buffer.read()  # all of it first: nothing is printed while the harness writes
    newline = raw.index(b"\n")
    spec = json.loads(raw[:newline])
    tokens = np.frombuffer(raw[newline + 1 :], dtype="<u2")
    torch.manual_seed(0)
    arrays = evaluate(spec, tokens)
    np.savez(spec["out"], **arrays)


if __name__ == "__main__":
    main()
