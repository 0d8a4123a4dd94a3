"""What the candidate's process enforces on itself, and what it reports as feedback.

The timer (``timer.py``) measures and checks everything that decides a score in a process the
candidate cannot reach; code running in the candidate's process can undo anything done
there. What stays here is a rule for honest candidates, not a defence of a number:

- inline C++ loading: ``torch.utils.cpp_extension.load`` / ``load_inline`` blocked, and any
  attempt remembered even if the candidate swallows the error (C++ solutions are compiled
  by the harness, ``build.py``);
- ``kernel_signature``: the kernels (on a CPU the aten ops) one call launches, shown to
  operators with the roofline.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
import torch.utils.cpp_extension as cpp_extension
from torch.utils._python_dispatch import TorchDispatchMode


class CheatDetected(Exception):
    """The candidate did something the benchmark forbids; the message says what."""


class CppBlocker:
    """Replaces ``torch.utils.cpp_extension`` loaders with functions that refuse and remember."""

    NAMES = ("load", "load_inline", "_jit_compile")

    def __init__(self) -> None:
        self.attempts: list[str] = []
        for name in self.NAMES:
            if hasattr(cpp_extension, name):
                setattr(cpp_extension, name, self._blocker(name))
        self.installed = {name: getattr(cpp_extension, name, None) for name in self.NAMES}

    def _blocker(self, name: str) -> Any:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            self.attempts.append(name)
            raise CheatDetected(
                f"torch.utils.cpp_extension.{name}() is not allowed: write kernels in Triton or PyTorch "
                "(inline C++/CUDA loading is blocked)"
            )

        return refuse

    def check(self, when: str) -> None:
        """Raise CheatDetected if a load was attempted or the blockers were removed."""
        if self.attempts:
            raise CheatDetected(
                f"{when}: the candidate tried inline C++ loading ({', '.join(self.attempts)})"
            )
        restored = [
            n for n, f in self.installed.items() if getattr(cpp_extension, n, None) is not f
        ]
        if restored:
            raise CheatDetected(
                f"{when}: the candidate restored blocked C++ loaders: {', '.join(restored)}"
            )


class _OpRecorder(TorchDispatchMode):
    """Counts the aten ops a call dispatches (the CPU stand-in for a kernel list)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.counts[str(func)] += 1
        return func(*args, **(kwargs or {}))


def kernel_signature(call: Any, args: Sequence[Any], device: torch.device) -> dict[str, int]:
    """Names and counts of the GPU kernels (torch profiler), or on a CPU the aten ops, one call launches."""
    if device.type != "cuda":
        recorder = _OpRecorder()
        with recorder:
            call(*args)
        return dict(sorted(recorder.counts.items()))
    from torch.profiler import ProfilerActivity, profile

    # Work queued before (input generation, output fills) must not show up in the window.
    torch.cuda.synchronize(device)
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            call(*args)
            torch.cuda.synchronize(device)
    except CheatDetected:
        raise
    except (
        Exception
    ) as exc:  # no CUPTI here: the check cannot run; that must not fail an honest kernel
        call(*args)  # a candidate's own error raises again here, outside the profiler
        torch.cuda.synchronize(device)
        return {f"(profiler unavailable: {type(exc).__name__})": 1}
    counts: Counter[str] = Counter()
    for event in prof.events():
        if str(getattr(event, "device_type", "")).endswith("CUDA"):
            counts[event.name] += 1
    return dict(sorted(counts.items()))
