"""The speedrun's clock marks, called by the candidate; the harness's own clock keeps the time.

The harness copies this file into the candidate's folder as ``speedrun_clock.py``. The
training program calls, on every rank::

    import speedrun_clock
    speedrun_clock.warmup_begin(model, optimizer)  # optional: before untimed warm-up steps
    ...                                            # warm up (compile), then restore the state
    speedrun_clock.start(model, optimizer)         # the clock starts here
    ...                                            # train
    speedrun_clock.stop(model)                     # saves the final weights; the clock stops

Training tokens come from ``speedrun_clock.tokens(offset, count)``: the harness serves the
stream over a unix socket (``SPEEDRUN_DATA``), with random tokens of the same shape before
``start`` (for warm-up and compilation) and none after ``stop``; the shards themselves are
hidden from the candidate.

Each mark is a JSON line sent over a unix socket to the harness, which timestamps it on
arrival with its own clock. ``start`` sends a SHA-256 of the model and optimizer state;
the harness requires it to equal the one sent by ``warmup_begin``, so warm-up steps must
be undone. The untrained weights are saved at the first mark so the harness can check
that they are untrained. ``stop`` writes the final weights first and sends their SHA-256:
the harness scores exactly those bytes, so training after the clock stopped cannot count.
The harness validates by itself; a candidate neither validates nor reports a loss.

Without a harness (``SPEEDRUN_CLOCK`` unset) the marks print local times, the weights go to
the working directory and ``tokens`` reads the shards in ``SPEEDRUN_TRAIN_FILES``, so the
program can be run by hand.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from evolve.harness.hashing import sha256_file

_state: dict[str, Any] = {"sock": None, "t0": None, "init_saved": False, "probes": 0, "paused": 0.0}


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain module under DDP and torch.compile wrappers."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner


def _send(event: str, **fields: Any) -> None:
    address = os.environ.get("SPEEDRUN_CLOCK")
    if not address:
        if _state["t0"] is None:
            _state["t0"] = time.perf_counter()
        print(
            f"[speedrun_clock] {event} at {time.perf_counter() - _state['t0']:.3f}s (no harness)",
            flush=True,
        )
        return
    if _state["sock"] is None:
        _state["sock"] = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        _state["sock"].connect(address)
        _state["reader"] = _state["sock"].makefile("r")
    _state["sock"].sendall(
        (json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n").encode()
    )
    reply = _state["reader"].readline().strip()
    if reply != "ok":
        raise RuntimeError(
            f"speedrun harness refused the {event!r} mark: {reply or 'connection closed'}"
        )


_local = threading.local()


def tokens(offset: int, count: int) -> np.ndarray:
    """``count`` training tokens from position ``offset`` of the stream (uint16; it wraps around).

    Raises:
        EOFError: the clock has stopped; the stream has ended.
    """
    address = os.environ.get("SPEEDRUN_DATA")
    if not address:
        return _local_tokens(offset, count)
    if getattr(_local, "sock", None) is None:
        _local.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        _local.sock.connect(address)
        _local.reader = _local.sock.makefile("rb")
    _local.sock.sendall(struct.pack("<qq", offset, count))
    (got,) = struct.unpack("<q", _local.reader.read(8))
    if got < 0:
        raise EOFError("the training data stream ended when the clock stopped")
    return np.frombuffer(_local.reader.read(2 * got), dtype="<u2")


def _local_tokens(offset: int, count: int) -> np.ndarray:
    """Without a harness: the shards in ``SPEEDRUN_TRAIN_FILES``, end to end."""
    if "shards" not in _state:
        _state["shards"] = [
            np.memmap(p, dtype="<u2", mode="r", offset=1024)
            for p in os.environ["SPEEDRUN_TRAIN_FILES"].split(os.pathsep)
        ]
    stream = np.concatenate(_state["shards"]) if len(_state["shards"]) > 1 else _state["shards"][0]
    return np.take(stream, np.arange(offset, offset + count), mode="wrap").astype("<u2")


def _path(name: str) -> Path:
    return Path(os.environ.get("SPEEDRUN_CKPT_DIR", ".")) / name


def _tensor_bytes(digest: Any, tensor: torch.Tensor) -> None:
    flat = tensor.detach().contiguous().reshape(-1).cpu()
    digest.update(str(tuple(tensor.shape)).encode() + str(tensor.dtype).encode())
    digest.update(flat.view(torch.uint8).numpy().tobytes())


def state_digest(
    model: torch.nn.Module,
    optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None,
) -> str:
    """SHA-256 over the model's state dict and every optimizer's state and hyperparameters."""
    digest = hashlib.sha256()
    for name, tensor in sorted(_unwrap(model).state_dict().items()):
        digest.update(name.encode())
        _tensor_bytes(digest, tensor)
    if isinstance(optimizers, torch.optim.Optimizer):
        optimizers = [optimizers]
    for optimizer in optimizers or []:
        state = optimizer.state_dict()
        for key in sorted(state["state"]):
            for field, value in sorted(state["state"][key].items()):
                digest.update(f"{key}.{field}".encode())
                if isinstance(value, torch.Tensor):
                    _tensor_bytes(digest, value)
                else:
                    digest.update(repr(value).encode())
        digest.update(json.dumps(state["param_groups"], sort_keys=True, default=repr).encode())
    return digest.hexdigest()


def _save(model: torch.nn.Module, path: Path) -> str:
    """Write the plain module's weights to ``path``; return the file's SHA-256."""
    state = {name: tensor.detach().cpu() for name, tensor in _unwrap(model).state_dict().items()}
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return sha256_file(path)


def _save_init(model: torch.nn.Module) -> dict[str, str]:
    if _state["init_saved"]:
        return {}
    _state["init_saved"] = True
    return {"init_sha256": _save(model, _path("init.pt"))}


def warmup_begin(model: torch.nn.Module, optimizer: Any = None) -> None:
    """Mark the start of the untimed warm-up; records the state that ``start`` must match."""
    if _rank() == 0:
        fields = _save_init(model)
        _send("warmup_begin", state=state_digest(model, optimizer), **fields)
    _barrier()


def start(model: torch.nn.Module, optimizer: Any = None) -> None:
    """Start the clock. Model and optimizer state must be what they were at ``warmup_begin``."""
    _barrier()
    if _rank() == 0:
        fields = _save_init(model)
        _send("start", state=state_digest(model, optimizer), **fields)
        _state["t0"] = time.perf_counter()
    _barrier()


def tick(model: torch.nn.Module) -> None:
    """Call once per step. Does nothing unless the harness asked for a loss curve (calibration).

    Then, every ``SPEEDRUN_PROBE_EVERY_S`` seconds of training, rank 0 pauses the clock,
    saves a probe checkpoint and resumes; the harness evaluates the probes afterwards.
    """
    every = float(os.environ.get("SPEEDRUN_PROBE_EVERY_S") or 0)
    if not every or _rank() != 0 or _state["t0"] is None:
        return
    if time.perf_counter() - _state["t0"] - _state["paused"] < (_state["probes"] + 1) * every:
        return
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    begin = time.perf_counter()
    _send("pause")
    _state["probes"] += 1
    name = f"probe-{_state['probes']:03d}.pt"
    _send("resume", path=name, sha256=_save(model, _path(name)))
    _state["paused"] += time.perf_counter() - begin


def stop(model: torch.nn.Module) -> None:
    """Save the final weights and stop the clock. Call once, after the last training step."""
    _barrier()
    if _rank() == 0:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        _send("stop", sha256=_save(model, _path("final.pt")))
    _barrier()
