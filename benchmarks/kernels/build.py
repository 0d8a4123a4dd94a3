"""The harness builds C++ solutions (cuda_cpp, cutlass, cudnn, cublas) into Python extensions.

Candidate code may not load C++ at run time (``guards.CppBlocker``); the harness compiles
a C++ solution's sources itself, as upstream's compile step does (``build_ext.py`` there:
``torch.utils.cpp_extension.load`` with the solution's ``compile_options`` added to
``-O3 --use_fast_math``, CUTLASS headers on the include path). The compiler runs in the
sandbox (``build_ext.py``, writes confined to a scratch folder, killed at the build
timeout); the finished ``.so`` is then copied by this process into a cache keyed by the
SHA-256 of everything that decides the result (sources, flags, languages, include paths,
torch/CUDA/Python versions). The cache lives outside every folder a sandboxed process may
write, so no candidate can plant a library for another; the candidate's process loads the ``.so``
the harness names, never one the candidate names.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evolve.types import EvolveError

from .process import harness_json
from .solution import Solution

BUILDER = "evolve.benchmarks.kernels.build_ext"
DEFAULT_CUDA_FLAGS = ("-O3", "--use_fast_math")
_SOURCE_SUFFIXES = (".cu", ".cpp", ".cc", ".cxx", ".c")


class BuildError(EvolveError):
    """A C++ solution that cannot be built here; the message says why and what to install."""


@dataclass(frozen=True, kw_only=True)
class Built:
    """A built extension: where its ``.so`` is and the module name it was built under."""

    path: str
    module: str
    key: str
    cached: bool
    seconds: float


def default_cache() -> Path:
    """The build cache: ``$EVOLVE_KERNELS_BUILD_CACHE`` or ``~/.cache/evolve/kernels-builds``."""
    env = os.environ.get("EVOLVE_KERNELS_BUILD_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "evolve" / "kernels-builds"


def find_nvcc() -> str | None:
    """The CUDA compiler: ``$CUDA_HOME/bin/nvcc`` or nvcc on PATH."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and Path(home, "bin", "nvcc").is_file():
        return str(Path(home, "bin", "nvcc"))
    return shutil.which("nvcc")


def cutlass_include() -> list[str]:
    """CUTLASS header folders: ``$CUTLASS_DIR`` (as upstream; default /usr/local/cutlass), else
    the headers the ``nvidia-cutlass`` wheel ships (``cutlass_library/source``)."""
    roots = [Path(os.environ.get("CUTLASS_DIR", "/usr/local/cutlass"))]
    try:
        import cutlass_library

        roots.append(Path(cutlass_library.__file__).parent / "source")
    except ImportError:
        pass
    for root in roots:
        if (root / "include" / "cutlass").is_dir():
            return [str(root / "include"), str(root / "tools" / "util" / "include")]
    return []


def _cudnn_paths() -> tuple[list[str], list[str]]:
    """Headers and libraries of the cuDNN wheel torch depends on (its lib has only ``libcudnn.so.N``,
    so ``-lcudnn`` becomes ``-l:libcudnn.so.N``)."""
    try:
        import nvidia.cudnn as cudnn_pkg
    except ImportError:
        return [], []
    root = Path(next(iter(cudnn_pkg.__path__)))
    flags = [f"-L{root / 'lib'}", f"-Wl,-rpath,{root / 'lib'}"]
    if not (root / "lib" / "libcudnn.so").exists():
        versioned = sorted((root / "lib").glob("libcudnn.so.*"))
        if versioned:
            flags.append(f"-l:{versioned[0].name}")
    return [str(root / "include")], flags


def cuda_home() -> str | None:
    """The toolkit folder of the nvcc found (handed to the sandboxed build as CUDA_HOME)."""
    nvcc = find_nvcc()
    if nvcc is None:
        return None
    home = Path(nvcc).resolve().parent.parent
    return str(home) if (home / "bin" / "nvcc").is_file() else None


def plan(solution: Solution) -> dict[str, Any]:
    """What to compile and with which flags; raises BuildError when the machine lacks a tool."""
    import torch

    sources = sorted(p for p in solution.sources if p.endswith(_SOURCE_SUFFIXES))
    if not sources:
        raise BuildError(
            f"{solution.name}: a {solution.language} solution needs C++/CUDA sources (.cu, .cpp)"
        )
    if not any("PYBIND11_MODULE" in solution.sources[p] for p in sources):
        raise BuildError(
            f'{solution.name}: no PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{ m.def("{solution.entry_function}", ...); }} '
            "in the sources; the torch binding needs one"
        )
    cuda = any(p.endswith(".cu") for p in sources) or solution.language in (
        "cutlass",
        "cudnn",
        "cublas",
    )
    if cuda and find_nvcc() is None:
        raise BuildError(
            f"{solution.language} needs the CUDA toolkit (nvcc): none on PATH or in $CUDA_HOME/bin. "
            "Install the CUDA toolkit matching torch's CUDA version, or write the kernel in triton or pytorch"
        )
    if cuda and torch.version.cuda is None:
        raise BuildError(
            f"{solution.language} needs a CUDA build of torch to link against; this torch "
            f"({torch.__version__}) is CPU-only"
        )
    includes, ld_flags = [], list(solution.ld_flags)
    if solution.language == "cutlass" or any("cutlass" in d.lower() for d in solution.dependencies):
        includes = cutlass_include()
        if not includes:
            raise BuildError(
                "cutlass needs the CUTLASS headers: set CUTLASS_DIR to a CUTLASS checkout, or pip install nvidia-cutlass"
            )
    if solution.language == "cudnn" or "cudnn" in solution.dependencies:
        extra_inc, extra_ld = _cudnn_paths()
        if any(f.startswith("-l:libcudnn") for f in extra_ld):
            ld_flags = [f for f in ld_flags if f != "-lcudnn"]
        includes, ld_flags = includes + extra_inc, ld_flags + extra_ld
    if solution.language == "cublas" or "cublas" in solution.dependencies:
        ld_flags.append("-lcublas")
    return {"sources": sources, "cflags": list(solution.cflags), "includes": includes, "ld_flags": ld_flags,
            "cuda_cflags": [*DEFAULT_CUDA_FLAGS, *solution.cuda_cflags]}  # fmt: skip


def build_key(solution: Solution, recipe: dict[str, Any]) -> str:
    """SHA-256 of everything the built library depends on."""
    import torch

    facts = {"sources": dict(sorted(solution.sources.items())), "recipe": recipe, "languages": solution.languages,
             "torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version, "nvcc": find_nvcc()}  # fmt: skip
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def build(solution: Solution, *, cache: Path | None = None, timeout_s: float = 600.0,
          env: dict[str, str] | None = None) -> Built:  # fmt: skip
    """The solution's extension, from the cache or compiled now in the sandbox.

    Raises:
        BuildError: a missing tool, a compiler error (with its output), or the build timeout.
    """
    started = time.monotonic()
    recipe = plan(solution)
    key = build_key(solution, recipe)
    module = f"evolve_kernel_{key[:16]}"
    folder = (cache or default_cache()) / key
    so = folder / f"{module}.so"
    if so.is_file():
        return Built(
            path=str(so), module=module, key=key, cached=True, seconds=time.monotonic() - started
        )
    scratch = Path(tempfile.mkdtemp(prefix="evolve-kernels-build-"))
    try:
        src = scratch / "src"
        for rel, text in solution.sources.items():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_text(text)
        job = {"name": module, "src": str(src), "out": str(scratch / "out"), **recipe}
        (scratch / "out").mkdir()
        build_env = dict(env or {})
        home = cuda_home()
        if home and "CUDA_HOME" not in build_env:
            build_env["CUDA_HOME"] = home
        payload, result = harness_json(BUILDER, job, cwd=scratch, timeout_s=timeout_s, env=build_env, gpu=True,
                                       writable=(scratch,))  # fmt: skip
        if result.timed_out:
            raise BuildError(
                f"{solution.name}: the build took longer than {timeout_s:.0f} s\n{result.tail(3000)}"
            )
        if not payload or "error" in payload:
            detail = (payload or {}).get("error") or f"exit {result.returncode}"
            raise BuildError(f"{solution.name}: the build failed: {detail}\n{result.tail(6000)}")
        built_so = Path(payload["so"]).resolve()
        if not built_so.is_relative_to((scratch / "out").resolve()) or not built_so.is_file():
            # the build process imports the module it built, so C++ static initialisers ran there:
            # only a library inside the build's own output folder is taken
            raise BuildError(
                f"{solution.name}: the build reported a library outside its output folder ({built_so})"
            )
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".{module}.so.{os.getpid()}"
        shutil.copy2(built_so, partial)
        partial.replace(so)  # atomic: a reader sees the whole library or none
        (folder / "build.json").write_text(
            json.dumps({"module": module, "solution": solution.name, **recipe}, indent=2)
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return Built(
        path=str(so), module=module, key=key, cached=False, seconds=time.monotonic() - started
    )
