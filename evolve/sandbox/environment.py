"""The environment of a sandboxed command: an allow-list without secrets, private HOME and caches."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

SECRET_PATTERN = re.compile(
    r"(_API_KEY|_TOKEN|_SECRET|_PASSWORD|_CREDENTIALS?)$|^(AWS_|GOOGLE_APPLICATION)", re.I
)
KEEP_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV", "CUDA_VISIBLE_DEVICES",
            "LD_LIBRARY_PATH", "TRITON_INTERPRET", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
            "NVSHMEM_DISABLE_NVLS", "OMP_NUM_THREADS", "TERM")  # fmt: skip
# With Policy.private_home: variables pointing at fresh folders in the workdir (under .sandbox),
# so that no cache a tool writes is shared with the next candidate. PYTHONPYCACHEPREFIX is not
# among them: a private one would make every evaluation recompile the bytecode of every library
# it imports (Python's __pycache__ folders outside the workdir are unwritable under Landlock);
# benchmarks with a compile cache point it at the cache's read-only bytecode (``evolve.harness.bytecode``).
PRIVATE_DIRS = {
    "HOME": "home",
    "TMPDIR": "tmp",
    "XDG_CACHE_HOME": "home/.cache",
    "XDG_CONFIG_HOME": "home/.config",
    "XDG_DATA_HOME": "home/.local/share",
    "XDG_STATE_HOME": "home/.local/state",
    "XDG_RUNTIME_DIR": "run",
    "TRITON_CACHE_DIR": "home/.cache/triton",
    "TORCHINDUCTOR_CACHE_DIR": "home/.cache/inductor",
    "TORCH_EXTENSIONS_DIR": "home/.cache/torch_extensions",
    "CUDA_CACHE_PATH": "home/.cache/nv",
    "MPLCONFIGDIR": "home/.config/matplotlib",
}


def scrub_env(env: Mapping[str, str], extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Keep only harmless variables, drop anything that looks like a secret, add ``extra``."""
    clean = {k: v for k, v in env.items() if k in KEEP_ENV and not SECRET_PATTERN.search(k)}
    clean.update(extra or {})
    return clean


def environment(workdir: Path, private_home: bool, env: Mapping[str, str] | None) -> dict[str, str]:
    """The command's environment: scrubbed, HOME, TMPDIR and caches in the workdir, ``env`` on top."""
    base = scrub_env(os.environ)
    if private_home:
        for var, name in PRIVATE_DIRS.items():
            path = workdir / ".sandbox" / name
            path.mkdir(parents=True, exist_ok=True)
            base[var] = str(path)
    return {**base, **(env or {})}
