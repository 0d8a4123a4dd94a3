"""A shared torch.compile cache: filled once by the harness's run of a seed, read by every later process through a private layer.

The inductor and Triton caches and the libraries' bytecode (``evolve.harness.bytecode``) live
in one folder. The harness's warm-up run of the seed (``warming``) writes it in place; every
other process sees it through a private writable layer of its own (``Policy.shared_caches``:
what a candidate writes there lands in the layer and vanishes with it, so nothing reaches the
next candidate or the evaluation of the same run), the bytecode read-only. Nothing is copied
per run. Where the sandbox has no mount namespace, Landlock keeps the folder read-only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from evolve.harness import bytecode

TOOLS = (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton"))
"""The compilers' cache variables and their subfolders of the cache."""


def environment(cache: str | Path, warming: bool) -> dict[str, str]:
    """The variables pointing a process's compilers and Python's bytecode at ``cache`` (the
    subfolders made if missing); bytecode is written only when ``warming``."""
    env = {}
    for name, sub in TOOLS:
        (Path(cache) / sub).mkdir(parents=True, exist_ok=True)
        env[name] = str(Path(cache) / sub)
    return {**env, **bytecode.environment(cache, warming)}


@dataclass(frozen=True)
class Access:
    """What a sandbox grants a process on the cache (``Policy``'s fields of the same names)."""

    writable: tuple[str, ...] = ()
    shared_caches: tuple[str, ...] = ()
    readonly: tuple[str, ...] = ()


def access(cache: str | Path | None, warming: bool) -> Access:
    """The cache writable in place when ``warming``, else shared through a private layer with its
    bytecode read-only; nothing without a cache."""
    if not cache:
        return Access()
    if warming:
        Path(cache).mkdir(parents=True, exist_ok=True)
        return Access(writable=(str(cache),))
    return Access(shared_caches=(str(cache),), readonly=bytecode.readonly(cache, warming))
