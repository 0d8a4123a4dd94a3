"""The local check's child that runs candidate code: the fresh model's logits and gradient norms, nothing else.

Started by ``probe`` inside the sandbox as the probe starts, in the candidate's folder, with
the training split hidden: it imports torch, waits for its spec (the rows' sizes, the
device, the entry, the program's settings), installs the guard, and only then runs candidate
code. It imports ``model.py`` as the export process does, then
runs the candidate's ``train.py`` only until it calls ``build_model(config)``: the model just
built is kept and the program is stopped there (no optimizer step, no torch.compile). Then,
eagerly and in eval mode: one forward and backward on the first fixed batch for the gradient
norms, and a forward of each batch whose float32 logits go into the shared memory ``probe``
reads; then the same forwards once more with every weight perturbed
(``evolve.harness.lm.perturb_``), so that a path closed at initialisation (a zero-initialised
output projection) cannot hide a look at the future from the causality probe. The answer is one JSON line on a pipe; this process's output goes to a log file.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import mmap
import os
import runpy
import sys

from evolve.harness.stream import wait_for_go

from . import guard
from .client import CONFIG_ENV

PROBE_ENV = "NANOCHAT_PROBE"  # its pipes' and shared memory's fds; the spec comes on GO_FD_ENV
OUTPUTS = 4  # logits written: base and probe batch, as built and perturbed


def import_model():
    """Import the current directory's ``model.py`` as module ``model``; it must define ``build_model``."""
    spec = importlib.util.spec_from_file_location("model", os.path.abspath("model.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["model"] = module
    spec.loader.exec_module(module)
    if not hasattr(module, "build_model"):
        raise AttributeError("model.py defines no build_model(config) -> torch.nn.Module")
    return module


class _Built(BaseException):
    """Stops ``train.py`` once its model exists (a BaseException: ``except Exception`` lets it through)."""


def build_from_training_program(entry: str):
    """Run ``entry`` until it calls ``model.build_model(config)``; return that model and config."""
    module = import_model()
    build, built = module.build_model, {}

    def intercept(config):
        try:
            model = build(config)
            config = json.loads(json.dumps(config))  # what train.py would save as config.json
        except Exception as exc:
            built["failure"] = f"{type(exc).__name__}: {exc}"
            raise
        built.update(model=model, config=config)
        raise _Built

    module.build_model = intercept  # `from model import build_model` in train.py gets this one
    sys.argv = [entry]
    try:
        runpy.run_path(entry, run_name="__main__")
    except BaseException as exc:  # _Built, or train.py failed or exited before building
        if "failure" in built:
            raise RuntimeError(f"build_model(config) failed: {built['failure']}") from None
        if "model" not in built:
            raise RuntimeError(
                f"train.py stopped before it called build_model(config) "
                f"({type(exc).__name__}: {exc}); the local check builds the model there"
            ) from None
    if "model" not in built:
        raise RuntimeError(
            "train.py ended without calling build_model(config) from model.py; the local check "
            "(and the scorer) build the model with it"
        )
    return built["model"], built["config"]


def grad_norms(model, vocab_size: int) -> dict[str, float]:
    """Gradient norms by role: tensors with a vocabulary-sized dimension (embeddings, head) and the rest.

    Grouped by role, not by name or shape, so that a candidate that renames, adds or removes
    layers gives the same two numbers to compare with the seed's.
    """
    squares = {"grad_norm_vocab": 0.0, "grad_norm_body": 0.0}
    for param in model.parameters():
        if param.grad is not None:
            group = "grad_norm_vocab" if vocab_size in param.shape else "grad_norm_body"
            squares[group] += float(param.grad.detach().float().pow(2).sum())
    return {name: math.sqrt(total) for name, total in squares.items()}


def measure(model, spec: dict, io: mmap.mmap) -> dict:
    """Gradient norms of the first batch's loss; both batches' logits written into ``io``."""
    import torch
    import torch.nn.functional as F

    from evolve.harness.lm import perturb_

    rows, seq, vocab, device = spec["rows"], spec["seq_len"], spec["vocab_size"], spec["device"]
    count = 2 * rows * (seq + 1)
    tokens = torch.frombuffer(io, dtype=torch.int32, count=count).view(2, rows, seq + 1)
    tokens = tokens.long().to(device)
    out = torch.frombuffer(
        io, dtype=torch.float32, count=OUTPUTS * rows * seq * vocab, offset=count * 4
    )
    out = out.view(OUTPUTS, rows, seq, vocab)
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.startswith("cuda")
        else contextlib.nullcontext()
    )

    def logits_of(inputs):
        with autocast:
            logits = model(inputs)
        if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != (rows, seq, vocab):
            got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise ValueError(
                f"model(inputs) must return logits of shape {(rows, seq, vocab)}, got {got}"
            )
        return logits.float()

    model = model.to(device).eval()
    first = tokens[0]
    loss = F.cross_entropy(logits_of(first[:, :-1]).reshape(-1, vocab), first[:, 1:].reshape(-1))
    loss.backward()
    norms = grad_norms(model, vocab)
    params = sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        for index in range(2):
            out[index].copy_(logits_of(tokens[index, :, :-1]).cpu())
        perturb_(model, torch.Generator().manual_seed(spec["perturb_seed"]))
        for index in range(2):
            out[2 + index].copy_(logits_of(tokens[index, :, :-1]).cpu())
    return {**norms, "params": params}


def main() -> None:
    """Launched before the job: import torch (the harness's code only), wait for the spec (the
    job's part: rows, sizes, device, entry, the program's settings), then run candidate code."""
    with contextlib.suppress(ImportError):  # a candidate without torch meets that itself
        import torch  # noqa: F401
    spec = json.loads(os.environ[PROBE_ENV]) | wait_for_go()
    if "entry" not in spec:  # the probe ended without a job
        return
    config = spec["config"]
    os.environ[CONFIG_ENV] = json.dumps(config)  # the program's settings, as training gets them
    guard.install(config.get("forbidden", []), spec["report_fd"])
    sys.path.insert(0, os.getcwd())
    io = mmap.mmap(spec["io_fd"], spec["io_bytes"])
    try:
        model, model_config = build_from_training_program(spec["entry"])
        answer = {"ok": True, "config": model_config, **measure(model, spec, io)}
    except BaseException as exc:  # the candidate's code failed: tell the probe why
        answer = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    os.write(spec["answer_fd"], (json.dumps(answer) + "\n").encode())


if __name__ == "__main__":
    main()
