"""Anti-cheat checks run by the driver around a candidate it has imported into its own process.

Each check names the cheat it catches (the list of SOL-ExecBench's ``reward_hack.py``, and
a few more):

- patched timers or harness functions: identities captured before the candidate is
  imported, compared after import and after every call (``Snapshot``): torch's and the
  clock's, and every attribute of the harness's own modules and their classes
  (``module_targets``: the clock ``timing`` captured, ``inputs.derive_seed``...), a
  function's code and defaults included;
- torch function / dispatch modes left active (a mode can fake or defer any op);
- extra threads still running after a call (work hidden from the timed window);
- proxy or lazy outputs: an output tensor whose class, storage, shape or strides the
  candidate changed (``TensorFacts``), or a returning call's value that is not plain
  tensors in a plain tuple, list or dict (``check_returned``: reading it would run the
  candidate's code after the timed window);
- inline C++ loading: ``torch.utils.cpp_extension.load`` / ``load_inline`` blocked, and
  any attempt remembered even if the candidate swallows the error;
- kernels changing between iterations: the multiset of kernels (ops on a CPU device) a
  call launches, profiled at several points, must not change.

Outputs cached across calls are caught by the driver's design rather than here: every
call gets fresh inputs and NaN-filled outputs, and calls inside the timed loop are
audited at unpredictable positions.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import torch
import torch.utils.cpp_extension as cpp_extension
from torch.utils._python_dispatch import TorchDispatchMode

_ACTIVE_COUNT = threading.active_count


class CheatDetected(Exception):
    """The candidate did something the benchmark forbids; the message says what."""


def _critical_targets() -> list[tuple[str, Any, str]]:
    """(label, owner, attribute) of every function whose identity the harness relies on."""
    targets = [
        ("torch.cuda.Event", torch.cuda.Event, "elapsed_time"),
        ("torch.cuda.Event", torch.cuda.Event, "record"),
        ("torch.cuda.Event", torch.cuda.Event, "synchronize"),
        ("torch.cuda", torch.cuda, "synchronize"),
        ("torch.cuda", torch.cuda, "Event"),
        ("time", time, "perf_counter_ns"),
        ("time", time, "perf_counter"),
        ("time", time, "monotonic"),
        ("threading", threading, "active_count"),
        ("json", json, "dumps"),
        ("torch", torch, "save"),
    ]
    # torch.manual_seed is left out: importing torch._dynamo (lazily, on several paths) rewraps
    # it; inputs.py calls its own reference, captured when the harness was imported.
    for name in ("randn", "randint", "empty", "isfinite", "where", "zeros_like", "tensor"):
        targets.append(("torch", torch, name))
    for name in ("to", "float", "abs", "sum", "max", "item", "copy_", "clone", "fill_", "zero_", "cpu",
                 "__sub__", "__gt__", "__add__", "__mul__", "__or__", "__invert__", "__eq__", "all", "numel",
                 "data_ptr", "stride", "detach", "contiguous", "view"):  # fmt: skip
        targets.append(("torch.Tensor", torch.Tensor, name))
    targets.append(("torch.Generator", torch.Generator, "manual_seed"))
    return targets


def module_targets(*modules: ModuleType) -> list[tuple[str, Any, str]]:
    """(label, owner, attribute) of every attribute of ``modules`` and of the classes they define:
    the harness calls its own functions and the clocks it captured through these names."""
    targets = []
    for module in modules:
        for name, value in vars(module).items():
            targets.append((module.__name__, module, name))
            if isinstance(value, type) and value.__module__ == module.__name__:
                # all but __dict__, a new mappingproxy at every read
                attrs = [attr for attr in vars(value) if attr != "__dict__"]
                targets += [(f"{module.__name__}.{name}", value, attr) for attr in attrs]
    return targets


def _identity(value: Any) -> tuple[Any, ...]:
    """The object, and a function's code and defaults (assigning ``f.__code__`` keeps ``f``)."""
    return (
        value,
        *(getattr(value, a, None) for a in ("__code__", "__defaults__", "__kwdefaults__")),
    )


def _same(now: tuple[Any, ...], seen: tuple[Any, ...]) -> bool:
    return all(a is b for a, b in zip(now, seen, strict=True))


class Snapshot:
    """Identities of the harness's critical functions, taken before the candidate is imported."""

    def __init__(self, extra: Sequence[tuple[str, Any, str]] = ()):
        self.targets = [*_critical_targets(), *extra]
        self.seen = {
            f"{label}.{attr}": _identity(getattr(owner, attr, None))
            for label, owner, attr in self.targets
        }

    def changed(self) -> list[str]:
        """Names of functions that are no longer the objects captured."""
        return [
            f"{label}.{attr}"
            for label, owner, attr in self.targets
            if not _same(_identity(getattr(owner, attr, None)), self.seen[f"{label}.{attr}"])
        ]

    def check(self, when: str) -> None:
        """Raise CheatDetected if a captured function was replaced or a torch mode is active."""
        changed = self.changed()
        if changed:
            raise CheatDetected(
                f"{when}: harness functions were replaced (patched timers or driver): {', '.join(changed)}"
            )
        modes = active_modes()
        if modes:
            raise CheatDetected(
                f"{when}: a torch {modes} mode is active; candidates must not install modes"
            )


def active_modes() -> str:
    """'function' or 'dispatch' when a TorchFunctionMode / TorchDispatchMode is on the stack, else ''."""
    found = []
    if torch._C._len_torch_function_stack() > 0:
        found.append("function")
    if torch._C._len_torch_dispatch_stack() > 0:
        found.append("dispatch")
    return "/".join(found)


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


def thread_count() -> int:
    """Live Python threads (through the function captured at import)."""
    return _ACTIVE_COUNT()


def check_threads(before: int, when: str) -> None:
    """Raise CheatDetected when more Python threads run than ``before``."""
    now = _ACTIVE_COUNT()
    if now > before:
        names = [t.name for t in threading.enumerate()]
        raise CheatDetected(
            f"{when}: {now - before} extra thread(s) still running after the call ({names}); no background threads"
        )


class TensorFacts:
    """What an output tensor is before a call: the candidate must write into it, not replace it."""

    def __init__(self, tensors: Sequence[torch.Tensor]):
        self.tensors = list(tensors)
        self.facts = [self._facts(t) for t in tensors]

    @staticmethod
    def _facts(t: torch.Tensor) -> tuple:
        return (
            type(t),
            t.data_ptr(),
            tuple(t.shape),
            tuple(t.stride()),
            t.dtype,
            t.device,
            t.storage_offset(),
        )

    def check(self, when: str) -> None:
        """Raise CheatDetected when an output changed class, storage, shape, strides or dtype."""
        for index, (t, before) in enumerate(zip(self.tensors, self.facts, strict=True)):
            if type(t) is not torch.Tensor:
                raise CheatDetected(
                    f"{when}: output {index} became a {type(t).__name__} (proxy/lazy tensors are not allowed)"
                )
            if self._facts(t) != before:
                raise CheatDetected(
                    f"{when}: output {index} was replaced or reshaped (storage, shape or strides changed); "
                    "write the results into the given output tensors"
                )


PLAIN_ITEMS = (torch.Tensor, int, float, bool)  # exact types: reading them runs no candidate code


def check_returned(value: Any, when: str) -> None:
    """Raise CheatDetected unless a returning call's value is plain: a ``torch.Tensor`` (or a
    Python number), or a tuple, list or dict (string keys) of them, all of exactly these types.

    Anything else (a Mapping or Sequence of the candidate's, a tensor subclass, an object with
    ``__float__``) is read by the harness after the call, so it could compute there, untimed.
    """
    if type(value) is dict:
        odd = [type(k).__name__ for k in value if type(k) is not str]
        items = list(value.values())
    else:
        odd, items = [], list(value) if type(value) in (tuple, list) else [value]
    odd += [type(v).__name__ for v in items if type(v) not in PLAIN_ITEMS]
    if odd:
        raise CheatDetected(
            f"{when}: the call returned {', '.join(sorted(set(odd)))}, not plain torch.Tensor outputs (alone, or "
            "in a tuple, list or dict): a lazy or proxy value would compute when the harness reads it, untimed"
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


def check_same_kernels(first: dict[str, int], other: dict[str, int], when: str) -> None:
    """Raise CheatDetected when a call launched a different set of kernels than the first profiled one."""
    if first != other:
        gone = sorted(set(first) - set(other))
        new = sorted(set(other) - set(first))
        changed = sorted(k for k in set(first) & set(other) if first[k] != other[k])
        raise CheatDetected(
            f"{when}: the kernels launched changed between iterations (missing {gone[:5]}, new {new[:5]}, "
            f"different counts {changed[:5]}); a kernel must do the same work on every call"
        )
