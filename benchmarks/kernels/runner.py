"""The candidate's process: imports the candidate and runs the calls the timer asks for; it measures nothing.

Started by the timer (``timer.py``) as ``python -P -m evolve.benchmarks.kernels.runner DEVICE FD``
in the folder holding the candidate's files, with one end of a unix socket pair as ``FD``
(``wire``). It imports torch and the harness's modules at once (a timer started ahead of
its evaluation starts this process too), then serves the timer's messages:

- ``load``: set the evaluation's variables, block inline C++ loading, import the entry
  (the candidate's function, or the problem's reference for the harness's own baselines);
- ``go``: attach the arena the message hands over (or keep the one attached before), run
  each call on its arguments (a returning call's outputs copied into the arena), wait for
  the device, answer ``done``;
- ``profile``: the kernels one call launches (feedback for operators, nothing more);
- ``release``: let go of the arena; ``end``: exit.

Nothing this process says is a measurement: the timer holds the inputs' seed, makes and
checks the inputs and outputs, and reads its own clock. Code the candidate runs here can
rewrite this module, answer for it or exit; it gains no number by that (``timer.py``).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import socket
import sys
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .process import exit_now


def _settle_lazy_imports(device: str) -> None:
    """Import before the candidate what it or the profiler imports lazily (torch._dynamo, Triton)."""
    if device.startswith("cuda"):
        import torch._dynamo  # noqa: F401
        import torch.profiler  # noqa: F401
    with contextlib.suppress(ImportError):
        import triton  # noqa: F401
        import triton.language  # noqa: F401


def load_entry(entry: Mapping[str, Any], problem_dir: str, harness_dir: str) -> Any:
    """The function to call: the candidate's (its Python file, or the extension the harness
    built), or the problem's reference (``{"reference": "eager" | "compile"}``, for baselines)."""
    if "reference" in entry:
        import torch

        from . import inputs, spec

        run = inputs.load_reference(spec.load_problem(problem_dir).definition, Path(harness_dir)).run
        return torch.compile(run, dynamic=False) if entry["reference"] == "compile" else run
    if "so" in entry:  # a C++ solution: the harness compiled it; the path is the harness's
        module_spec = importlib.util.spec_from_file_location(entry["module"], entry["so"])
        assert module_spec and module_spec.loader
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        sys.path.insert(0, str(Path.cwd()))
        module = importlib.import_module(entry["file"].removesuffix(".py").replace("/", "."))
    return getattr(module, entry["function"], None)


def copy_returned(returned: Any, outputs: Sequence[Any], names: Sequence[str]) -> None:
    """A returning call's value (tensor, number, or a tuple, list or dict of them) into ``outputs``."""
    if isinstance(returned, Mapping):
        items = [returned[name] for name in names]
    elif isinstance(returned, Sequence) and not isinstance(returned, str):
        items = list(returned)
    else:
        items = [returned]
    if len(items) != len(outputs):
        raise ValueError(f"the call returned {len(items)} value(s), the definition has {len(outputs)} output(s)")
    for out, item in zip(outputs, items, strict=True):
        out.copy_(item) if hasattr(item, "shape") else out.fill_(item)


class Runner:
    """The state between messages: the function, the attached arena and its calls."""

    def __init__(self, end: socket.socket, device: str):
        import torch

        from . import arena, guards

        self.end, self.torch, self.arena_module, self.guards = end, torch, arena, guards
        self.device = torch.device(device)
        self.fn: Any = None
        self.blocker: Any = None
        self.dps, self.names = True, []
        self.attached: Any = None
        self.calls: list[tuple[list[Any], list[Any]]] = []

    def load(self, message: dict[str, Any]) -> dict[str, Any]:
        os.environ.update(message.get("env", {}))  # the evaluation's seed, for the candidate
        entry = message["entry"]
        self.dps = bool(entry.get("dps", "reference" not in entry))  # the reference returns its outputs
        self.names = list(message["outputs"])
        self.blocker = self.guards.CppBlocker()
        self.fn = load_entry(entry, message["problem_dir"], message["harness_dir"])
        if not callable(self.fn):
            return {"error": f"{entry.get('file')} defines no callable {entry.get('function')}()"}
        self.blocker.check("after import")
        return {"loaded": True}

    def attach(self, message: dict[str, Any], fds: list[int]) -> None:
        arena = self.arena_module
        self.release()
        self.attached = arena.Attached(message["arena"], fds, self.device)
        attached = self.attached

        def value(arg: dict[str, Any]) -> Any:
            return attached.view(arena.Placed.from_json(arg["tensor"])) if "tensor" in arg else arg["scalar"]

        self.calls = [([value(a) for a in call["args"]], [value(o) for o in call["outputs"]])
                      for call in message["calls"]]  # fmt: skip

    def go(self, message: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        if "arena" in message:
            self.attach(message, fds)
        with self.torch.no_grad():
            for args, outputs in self.calls:
                if self.dps:
                    self.fn(*args, *outputs)
                else:
                    copy_returned(self.fn(*args), outputs, self.names)
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
        self.blocker.check("after a call")
        return {"done": len(self.calls)}

    def profile(self) -> dict[str, Any]:
        args, outputs = self.calls[0]
        call_args = [*args, *outputs] if self.dps else args
        with self.torch.no_grad():
            return {"kernels": self.guards.kernel_signature(self.fn, call_args, self.device)}

    def release(self) -> dict[str, Any]:
        self.calls = []
        if self.attached is not None:
            self.attached.close()
            self.attached = None
        return {"released": True}

    def serve(self) -> None:
        """Answer the timer's messages until ``end`` or until the timer is gone."""
        from . import wire

        while True:
            try:
                message, fds = wire.receive(self.end)
            except wire.ChannelClosed:
                return
            op = message.get("op")
            if op == "end":
                return
            try:
                if op == "load":
                    answer = self.load(message)
                elif op == "go":
                    answer = self.go(message, fds)
                elif op == "profile":
                    answer = self.profile()
                elif op == "release":
                    answer = self.release()
                else:
                    answer = {"error": f"unknown message {op!r}"}
            except self.guards.CheatDetected as exc:
                answer = {"cheat": str(exc)}
            except Exception as exc:  # the candidate's own error: reported for its feedback
                if isinstance(exc, self.torch.cuda.OutOfMemoryError):
                    self.torch.cuda.empty_cache()
                answer = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
            wire.send(self.end, answer)


def main() -> int:
    """Import, then serve the timer until it ends the session."""
    device, fd = sys.argv[1], int(sys.argv[2])
    end = socket.socket(fileno=fd)
    try:
        import torch  # noqa: F401

        from . import arena, guards, inputs, spec, wire  # noqa: F401

        _settle_lazy_imports(device)
    except Exception as exc:
        from . import wire

        wire.send(end, {"fatal": f"the candidate's process failed to start: {type(exc).__name__}: {exc}"})
        return 0
    Runner(end, device).serve()
    return 0


if __name__ == "__main__":
    exit_now(main())
