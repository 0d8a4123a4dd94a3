"""The scorer's child that runs the candidate's model: tokens in, logits out, nothing else.

Started by the scorer inside the evaluation sandbox, in a directory that will hold only the
checkpoint (``model.py``, ``config.json``, ``model.pt``), as soon as the scorer starts: it
imports torch, then waits for its spec (the logits buffer, the device, the forbidden paths)
at the head of the request pipe, which the scorer sends once it has its job and the
checkpoint is in place. The guard is installed before any candidate code is imported. For
each request (slot, B, T, then B*T int32 tokens) it runs
``model(inputs)`` and writes the logits (float32) into that slot of the buffer the scorer
shares with it (``evolve.harness.lm.shared_logits``: GPU memory through CUDA IPC on a GPU,
so the logits never cross to the host); then it answers one JSON line. The scorer, a
separate process, turns those logits into the score.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import struct
import sys

from evolve.benchmarks.nanochat import guard

SPEC = struct.Struct("<I")  # bytes of the JSON spec that opens the request pipe
HEADER = struct.Struct("<4sIII")
MAGIC = b"NCRQ"
WORKER_ENV = "NANOCHAT_WORKER"


def _read_exact(fd: int, size: int) -> bytes:
    parts, remaining = [], size
    while remaining:
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            raise EOFError
        parts.append(chunk)
        remaining -= len(chunk)
    return b"".join(parts)


def _answer(fd: int, **message) -> None:
    os.write(fd, (json.dumps(message) + "\n").encode())


def import_model():
    """Import the current directory's ``model.py`` as module ``model``; it must define ``build_model``."""
    spec = importlib.util.spec_from_file_location("model", os.path.abspath("model.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["model"] = module
    spec.loader.exec_module(module)
    if not hasattr(module, "build_model"):
        raise AttributeError("model.py defines no build_model(config) -> torch.nn.Module")
    return module


def load_model(device: str):
    """Import ``model.py`` from the current directory, build the model and load its weights."""
    import torch

    module = import_model()
    with open("config.json") as handle:
        config = json.load(handle)
    model = module.build_model(config)
    state = torch.load("model.pt", map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model.to(device).eval()


def serve(spec: dict) -> None:
    import torch

    from evolve.harness.lm import open_shared_logits

    req, resp = spec["request_fd"], spec["response_fd"]
    device = spec["device"]
    out = open_shared_logits(spec["logits"])  # (slots, rows, seq, vocab)
    vocab = out.shape[-1]
    try:
        model = load_model(device)
    except Exception as exc:  # the candidate's code failed to load: tell the scorer why
        _answer(resp, error=f"loading the checkpoint failed: {type(exc).__name__}: {exc}")
        return
    _answer(resp, ready=True)
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.startswith("cuda")
        else contextlib.nullcontext()
    )
    while True:
        try:
            magic, slot, batch, seq = HEADER.unpack(_read_exact(req, HEADER.size))
            raw = _read_exact(req, batch * seq * 4)
        except EOFError:
            return
        if magic != MAGIC or slot >= out.shape[0] or (batch, seq) != tuple(out.shape[1:3]):
            _answer(resp, error="bad request")
            return
        inputs = (
            torch.frombuffer(bytearray(raw), dtype=torch.int32).view(batch, seq).to(device).long()
        )
        try:
            with torch.inference_mode(), autocast:
                logits = model(inputs)
            if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != (batch, seq, vocab):
                shape = (
                    tuple(logits.shape)
                    if isinstance(logits, torch.Tensor)
                    else type(logits).__name__
                )
                _answer(
                    resp,
                    error=f"model(inputs) must return logits of shape {(batch, seq, vocab)}, got {shape}",
                )
                return
            with torch.inference_mode():
                out[slot].copy_(logits)
            if device.startswith("cuda"):
                torch.cuda.synchronize()  # the scorer reads the slot once it has the answer
        except Exception as exc:
            _answer(resp, error=f"model forward failed: {type(exc).__name__}: {exc}")
            return
        _answer(resp, slot=slot, ok=True)


def main() -> None:
    """Started before the scorer has its job: import torch, then wait for the spec (the logits
    slots, the device, the forbidden paths) at the head of the request pipe; install the guard;
    only then import the candidate's code and serve."""
    import torch  # noqa: F401 - imported while waiting: the scorer's job is still on its way

    spec = json.loads(os.environ[WORKER_ENV])
    try:
        (size,) = SPEC.unpack(_read_exact(spec["request_fd"], SPEC.size))
        spec.update(json.loads(_read_exact(spec["request_fd"], size)))
    except EOFError:  # the scorer ended without a job (cancelled)
        return
    guard.install(spec["forbidden"], spec["report_fd"])
    sys.path.insert(0, os.getcwd())
    serve(spec)


if __name__ == "__main__":
    main()
