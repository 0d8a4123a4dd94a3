"""Python bytecode of the libraries that harness and candidate processes import, kept in the compile cache.

Python compiles a module's source to bytecode when it imports it, and saves that beside the
source (``__pycache__``). Where the installed libraries carry none and may not be given any (a
read-only install, or one made with ``PYTHONDONTWRITEBYTECODE``, as on the lent H200 machine:
not one ``.pyc`` among torch's 2,141 modules), every process compiles them all again: importing
torch, ``torch._dynamo`` and inductor's ``compile_fx`` took 14 s a process there, 4.6 s with
their bytecode in a cache (2026-12-02, ``benchmarks/nanochat/RESULTS.md``).

With a compile cache, the harness points ``PYTHONPYCACHEPREFIX`` (Python reads and writes all
bytecode there instead of beside the sources) at the cache's ``bytecode`` folder: the
harness's warm-up run of the seed writes it; every later process, harness or candidate,
only reads it (``PYTHONDONTWRITEBYTECODE``, and ``readonly``: a bind mount where the sandbox
has a mount namespace, else checked after the run). So a candidate can neither plant bytecode
that a harness process would run nor leave anything there for the next candidate. A module the
warm-up never imported is compiled in memory on each import, as without the cache.
"""

from __future__ import annotations

from pathlib import Path

PREFIX_ENV = "PYTHONPYCACHEPREFIX"
NO_WRITES_ENV = "PYTHONDONTWRITEBYTECODE"
FOLDER = "bytecode"


def folder(cache: str | Path) -> Path:
    """The bytecode folder of the compile cache ``cache`` (made if missing)."""
    path = Path(cache) / FOLDER
    path.mkdir(parents=True, exist_ok=True)
    return path


def environment(cache: str | Path, warming: bool) -> dict[str, str]:
    """The variables that make a Python process read bytecode in ``cache``; only when ``warming``
    (the harness's run of the seed) does it write there too. Every other process is told not to
    (``PYTHONDONTWRITEBYTECODE``), so that where no mount makes the folder read-only, no honest
    process's write trips the change check after the run."""
    env = {PREFIX_ENV: str(folder(cache))}
    if not warming:
        env[NO_WRITES_ENV] = "1"
    return env


def readonly(cache: str | Path | None, warming: bool) -> tuple[str, ...]:
    """The paths a sandbox keeps read-only for the bytecode: the folder, unless ``warming`` (the
    harness's run of the seed that fills it) or there is no cache."""
    return (str(folder(cache)),) if cache and not warming else ()
