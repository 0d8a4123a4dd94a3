"""Keep candidate code off files it must not read (validation data), installed before it runs.

``install`` adds a Python audit hook (PEP 578; it cannot be removed once added) that
refuses, with PermissionError, any open, listing, link, rename or copy of a path under a
forbidden root, and reports each attempt on a file descriptor owned by the harness (which
then rejects the candidate). It also refuses subprocess commands that name a forbidden
root.

What it does NOT stop: native code that opens files without Python's audit events (for
example ``numpy.fromfile``, ``ctypes`` calls to ``open``). The training process is never
told where validation data lives, and a candidate that goes looking for it by such means
is outside what this guard closes; see the benchmark README ("threat model").

Run as ``python -m evolve.benchmarks.nanochat.guard SCRIPT``: reads the forbidden roots from
the harness's config variable, installs the hook, then runs SCRIPT as ``__main__``. With
``--wait`` instead of SCRIPT (a training program launched before its job), it first imports
torch and its compiler, then waits for the harness's go, which names SCRIPT and carries the
job's variables.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import sys
from collections.abc import Sequence

from evolve.harness.clock import REPORT_FD_ENV

PATH_EVENTS = {
    "open": (0,),
    "os.listdir": (0,),
    "os.scandir": (0,),
    "os.chdir": (0,),
    "os.link": (0, 1),
    "os.symlink": (0, 1),
    "os.rename": (0, 1),
    "shutil.copyfile": (0, 1),
    "shutil.copytree": (0, 1),
    "os.truncate": (0,),
    "os.chmod": (0,),
    "os.utime": (0,),
    "os.remove": (0,),
    "os.rmdir": (0,),
}
WAIT = "--wait"  # launched ahead of its job: prepare, then wait for the go (``prepare_and_wait``)
# imported by a program launched ahead before its go, off the clock (torch alone: 5.7 s on the H200)
PREIMPORTED = ("torch", "torch._dynamo", "torch._inductor.compile_fx")
# variables those imports read (most TORCHINDUCTOR_/TORCHDYNAMO_ settings); the cache folder is read later
READ_AT_IMPORT = ("TORCHINDUCTOR_", "TORCHDYNAMO_", "TORCH_LOGS", "TORCH_COMPILE_DEBUG")
READ_LATER = ("TORCHINDUCTOR_CACHE_DIR",)
COMMAND_EVENTS = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn"}


def _as_text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return os.fsdecode(value)
    if isinstance(value, os.PathLike):
        return _as_text(os.fspath(value))
    return None


def _flatten(value: object) -> list[str]:
    if isinstance(value, list | tuple):
        return [t for item in value for t in _flatten(item)]
    text = _as_text(value)
    return [text] if text is not None else []


def install(forbidden: Sequence[str], report_fd: int | None = None) -> None:
    """Install the audit hook refusing access under ``forbidden`` (reported on ``report_fd``)."""
    roots = tuple(os.path.realpath(root) for root in forbidden if root)
    if not roots:
        return
    realpath, join, getcwd, write = os.path.realpath, os.path.join, os.getcwd, os.write
    busy = [False]

    def under(path: str) -> bool:
        real = realpath(join(getcwd(), path))
        return any(real == root or real.startswith(root + os.sep) for root in roots)

    def refuse(event: str, what: str) -> None:
        if report_fd is not None:
            with contextlib.suppress(OSError):
                write(
                    report_fd,
                    ("violation " + json.dumps({"event": event, "path": what}) + "\n").encode(),
                )
        raise PermissionError(f"the nanochat harness forbids access to {what!r} (validation data)")

    def hook(event: str, args: tuple) -> None:
        if busy[0]:
            return
        if event in PATH_EVENTS:
            busy[0] = True
            try:
                hits = [
                    p
                    for i in PATH_EVENTS[event]
                    if i < len(args) and (p := _as_text(args[i])) and under(p)
                ]
            finally:
                busy[0] = False
            if hits:
                refuse(event, hits[0])
        elif event in COMMAND_EVENTS:
            words = _flatten(args)
            for root in roots:
                if any(root in word for word in words):
                    refuse(event, root)

    sys.addaudithook(hook)


def prepare_and_wait() -> list[str]:
    """Launched before its job (``--wait``): import torch and its compiler (the harness's code
    only: nothing of the candidate's runs here), then wait for the harness's go; apply the
    job's environment it carries and return the program's command line. CUDA is left for the
    program to start, so that what it sets before (``PYTORCH_CUDA_ALLOC_CONF``, read when CUDA
    starts) still holds; variables torch reads as it is imported are not read again
    (``warn_late_settings``)."""
    for module in PREIMPORTED:
        with contextlib.suppress(ImportError):  # a program without torch meets that itself
            importlib.import_module(module)
    from evolve.harness.stream import wait_for_go

    from . import client  # noqa: F401 - the program's API, imported too

    message = wait_for_go()
    if not message:  # the harness went away without a job
        raise SystemExit(0)
    os.environ.update({str(k): str(v) for k, v in message["env"].items()})
    sys.addaudithook(warn_late_settings)
    return [str(word) for word in message["argv"]]


def warn_late_settings(event: str, args: tuple) -> None:
    """In a program whose torch was imported before it started: say, in its log, that a
    variable torch's compiler reads as it is imported (``TORCHINDUCTOR_MAX_AUTOTUNE``,
    ``TORCH_LOGS``...) is set too late to count, and what to use instead."""
    if event != "os.putenv" or not (name := _as_text(args[0])):
        return
    if name.startswith(READ_AT_IMPORT) and name not in READ_LATER:
        print(
            f"evolve: {name} is set after the harness imported {', '.join(PREIMPORTED)}, which"
            " read such variables as they are imported, so it may not take effect: set"
            " torch._inductor.config, torch._dynamo.config or torch._logging.set_logs instead",
            file=sys.stderr,
            flush=True,
        )


def main() -> None:
    argv = sys.argv[1:]
    if not argv:
        raise SystemExit(
            "usage: python -m evolve.benchmarks.nanochat.guard (SCRIPT | --wait) [ARGS...]"
        )
    if argv[0] == WAIT:
        argv = prepare_and_wait()
    config = json.loads(os.environ.get("NANOCHAT_CONFIG", "{}"))
    report = os.environ.get(REPORT_FD_ENV)
    install(config.get("forbidden", []), int(report) if report else None)
    sys.argv = argv
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
