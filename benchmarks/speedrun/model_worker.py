"""The evaluation's child that runs the candidate's model: input rows in, logits out, never a target.

Started by the harness's scorer (``evaluate.py``) as the scorer starts, in a pristine copy of
the candidate's folder (so ``import train`` finds the candidate's model), with its stdin
closed and one connection to the scorer. It imports torch, then waits for its spec (the
logits buffer's handle and the device): no candidate code runs before that message, which
the scorer sends once it has its job. Requests are then JSON messages: ``{"load": path}``
(with ``"reference": seed`` for the initial checkpoint: say where it differs from
``torch.manual_seed(seed); build_model()``) loads the checkpoint into the model that
``train.build_model()`` built at the first load (forward passes run on copies of it, so
nothing of one checkpoint's passes reaches the next) and answers with its parameter count; ``{"rows": n}``,
followed by n rows of int32 input tokens, runs the model on a fresh copy of the loaded
model and writes its logits over the real vocabulary into the buffer shared with the scorer
(``evolve.harness.lm.shared_logits``). Each is answered with one JSON message. The scorer
holds the targets and computes the loss; this process never receives them.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from multiprocessing.connection import Connection

import numpy as np
import torch

from evolve.harness.lm import open_shared_logits

WORKER_ENV = "SPEEDRUN_MODEL_WORKER"


def reference_diff(state: dict, reference: dict) -> str:
    """Where ``state`` differs from ``reference`` (``torch.manual_seed(seed); build_model()``'s
    state); "" when it does not."""
    if sorted(reference) != sorted(state):
        return f"its tensors are {sorted(state)[:5]}..., build_model() gives {sorted(reference)[:5]}..."
    for name, tensor in reference.items():
        got = state[name]
        if got.shape != tensor.shape or not torch.equal(got, tensor.to(got.dtype)):
            return f"first difference in {name!r}"
    return ""


def forward(model: torch.nn.Module, x: torch.Tensor, vocab_size: int, device: str) -> torch.Tensor:
    """The model's logits for ``x``, checked for shape (a wider, padded vocabulary is allowed)."""
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16, enabled=device == "cuda"):
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


def serve(conn: Connection, out: torch.Tensor, device: str) -> None:
    """Answer the scorer's requests until it closes the connection."""
    sys.path.insert(0, os.getcwd())
    import train  # the candidate's program; its __main__ block does not run

    vocab = out.shape[-1]
    model = None
    while True:
        try:
            request = json.loads(conn.recv_bytes())
        except EOFError:
            return
        answer: dict = {}
        if "load" in request:
            state = torch.load(request["load"], map_location="cpu", weights_only=True, mmap=True)
            answer["params"] = int(sum(t.numel() for t in state.values()))
            if model is None or "reference" in request:  # one model takes every checkpoint
                if "reference" in request:
                    torch.manual_seed(int(request["reference"]))
                built = train.build_model()
                if "reference" in request:
                    answer["reference_diff"] = reference_diff(state, built.state_dict())
                model = built.to(device).eval()
            model.load_state_dict(state, strict=True)
            del state
        else:
            rows = np.frombuffer(conn.recv_bytes(), dtype=np.int32).reshape(request["rows"], -1)
            x = torch.from_numpy(rows.astype(np.int64)).to(device)
            logits = forward(copy.deepcopy(model), x, vocab, device)
            out[: len(rows)].copy_(logits[..., :vocab])
            if device == "cuda":
                torch.cuda.synchronize()  # the scorer reads the buffer once it has the answer
        conn.send_bytes(json.dumps(answer).encode())


def main() -> None:
    conn = Connection(int(os.environ.pop(WORKER_ENV)))
    try:
        spec = json.loads(conn.recv_bytes())  # the scorer has its job: the buffer and the device
    except EOFError:
        return  # the scorer ended unused
    out = open_shared_logits(spec["logits"])
    conn.send_bytes(b"{}")
    torch.manual_seed(0)
    serve(conn, out, spec["device"])


if __name__ == "__main__":
    main()
