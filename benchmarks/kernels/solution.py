"""Upstream's solution format: ``solution_*.json`` with its sources, entry point and calling style.

A SOL-ExecBench solution (``docs/solution.md`` of NVIDIA/SOL-ExecBench) is one JSON file:
``name``, ``definition``, ``spec`` (``languages``, ``entry_point`` as ``file::function``,
``destination_passing_style``, ``binding``, ``compile_options`` with ``cflags``,
``cuda_cflags``, ``ld_flags``, ``dependencies``) and ``sources`` (``path`` and ``content``
per file). Python languages (pytorch, triton, cute_dsl, cutile, cudnn_frontend) are imported
from their entry file; C++ languages (cuda_cpp, cutlass, cudnn, cublas) are compiled by the harness into a
Python extension (``build.py``) whose function is the entry point.

In an evolve run the candidate folder holds ``solution.json`` and its sources as plain
files: the sources are what operators edit, and the harness reads their current text
(the ``content`` fields in the JSON are only the seed's). ``stage`` writes a solution out
that way; ``read_candidate`` reads it back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from .spec import SpecError

PYTHON_LANGUAGES = ("pytorch", "triton", "cute_dsl", "cutile", "cudnn_frontend")
CPP_LANGUAGES = ("cuda_cpp", "cutlass", "cudnn", "cublas")
LANGUAGES = PYTHON_LANGUAGES + CPP_LANGUAGES
SOLUTION_FILE = "solution.json"
# Python packages a language needs at run time (checked before a candidate is measured).
LANGUAGE_MODULES = {"triton": "triton", "cute_dsl": "cutlass.cute", "cutile": "cuda.tile",
                    "cudnn_frontend": "cudnn"}  # fmt: skip
LANGUAGE_PACKAGES = {"triton": "triton", "cute_dsl": "nvidia-cutlass-dsl", "cutile": "cuda-tile",
                     "cudnn_frontend": "nvidia-cudnn-frontend"}  # fmt: skip


_CPP_RULE = ("C++/CUDA compiled by the harness (-O3 --use_fast_math + compile_options) into a torch extension: "
             "bind the entry with PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"run\", &run); }, launch on "
             "at::cuda::getCurrentCUDAStream(); never load C++ from Python")  # fmt: skip
LANGUAGE_RULES = {
    "pytorch": "Python with torch ops; the entry file is imported as is",
    "triton": "Python + Triton (@triton.jit kernels launched from the entry function); tune BLOCK sizes, warps, stages",
    "cute_dsl": "Python + CuTe DSL (cutlass.cute): compile once (cute.compile) and cache the compiled kernel at module level",
    "cutile": "Python + cuTile (cuda.tile) kernels launched from the entry function",
    "cudnn_frontend": "Python + cuDNN frontend graphs built once and cached",
    "cuda_cpp": _CPP_RULE,
    "cutlass": _CPP_RULE + "; CUTLASS/CuTe headers are on the include path",
    "cudnn": _CPP_RULE + "; linked with -lcudnn",
    "cublas": _CPP_RULE + "; linked with -lcublas",
}


@dataclass(frozen=True, kw_only=True)
class Solution:
    """One solution: its language(s), entry point, calling style and source files."""

    name: str
    definition: str
    languages: tuple[str, ...]
    entry_file: str
    entry_function: str
    destination_passing: bool
    binding: str | None
    sources: Mapping[str, str]
    cflags: tuple[str, ...] = ()
    cuda_cflags: tuple[str, ...] = ()
    ld_flags: tuple[str, ...] = ()
    dependencies: tuple[str, ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict)

    @property
    def compiled(self) -> bool:
        """True when the harness must build it (any C++ language)."""
        return any(lang in CPP_LANGUAGES for lang in self.languages)

    @property
    def language(self) -> str:
        return self.languages[0]

    def rules(self) -> str:
        """What operators must know to edit it: calling style and the language's rules."""
        style = ("destination-passing: the inputs, then the outputs to fill in place" if self.destination_passing
                 else "returning: the inputs only; return the outputs (a tensor, a tuple in output order, or a dict)")  # fmt: skip
        return (f"Solution {self.name}: {'+'.join(self.languages)}, entry {self.entry_file}::{self.entry_function} "
                f"({style}). Editable: {', '.join(self.sources)}. "
                + " ".join(LANGUAGE_RULES[lang] + "." for lang in self.languages))  # fmt: skip


def _safe_path(text: str, where: str) -> str:
    path = PurePosixPath(text)
    if not text or path.is_absolute() or ".." in path.parts:
        raise SpecError(
            f"{where}: source path {text!r} must be relative and stay inside the solution"
        )
    return str(path)


def parse_solution(data: Mapping[str, Any], where: str = "solution") -> Solution:
    """Build a Solution from parsed JSON; the error names the field that is wrong."""
    spec = data.get("spec") or {}
    languages = tuple(spec.get("languages") or ())
    unknown = [lang for lang in languages if lang not in LANGUAGES]
    if not languages or unknown:
        raise SpecError(
            f"{where}: spec.languages must list some of {', '.join(LANGUAGES)}; got {list(languages)}"
        )
    entry = spec.get("entry_point") or ""
    entry_file, _, function = entry.rpartition("::") if "::" in entry else (entry, "", "run")
    if not entry_file:
        raise SpecError(f"{where}: spec.entry_point must be 'file::function', got {entry!r}")
    sources = {}
    for item in data.get("sources") or ():
        sources[_safe_path(item.get("path", ""), where)] = item.get("content", "")
    if entry_file not in sources:
        raise SpecError(
            f"{where}: entry point file {entry_file!r} is not among the sources {sorted(sources)}"
        )
    options = spec.get("compile_options") or {}
    binding = spec.get("binding")
    solution = Solution(
        name=str(data.get("name") or "solution"), definition=str(data.get("definition") or ""),
        languages=languages, entry_file=entry_file, entry_function=function or "run",
        destination_passing=bool(spec.get("destination_passing_style", True)), binding=binding,
        sources=sources, cflags=tuple(options.get("cflags") or ()), cuda_cflags=tuple(options.get("cuda_cflags") or ()),
        ld_flags=tuple(options.get("ld_flags") or ()), dependencies=tuple(spec.get("dependencies") or ()), raw=dict(data),
    )  # fmt: skip
    if solution.compiled and not all(lang in CPP_LANGUAGES for lang in languages):
        raise SpecError(
            f"{where}: C++ and Python languages cannot be mixed in one solution ({list(languages)})"
        )
    if solution.compiled and binding not in (None, "torch"):
        raise SpecError(
            f"{where}: binding {binding!r} is not supported; C++ solutions bind through torch (PYBIND11_MODULE)"
        )
    if not solution.compiled and not entry_file.endswith(".py"):
        raise SpecError(
            f"{where}: a {solution.language} solution's entry point must be a .py file, got {entry_file!r}"
        )
    return solution


def load_solution(path: Path | str) -> Solution:
    """Read a ``solution*.json`` file, or the only one in a folder."""
    path = Path(path)
    if path.is_dir():
        found = sorted(path.glob("solution*.json"))
        if len(found) != 1:
            raise SpecError(f"{path}: expected one solution*.json, found {[p.name for p in found]}")
        path = found[0]
    try:
        return parse_solution(json.loads(path.read_text()), str(path))
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path}: not valid JSON ({exc})") from exc


def stage(solution: Solution, folder: Path) -> None:
    """Write ``solution.json`` and every source as a file into ``folder`` (a candidate's layout)."""
    folder.mkdir(parents=True, exist_ok=True)
    for rel, content in solution.sources.items():
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    (folder / SOLUTION_FILE).write_text(json.dumps(dict(solution.raw), indent=2) + "\n")


def read_candidate(folder: Path) -> Solution | None:
    """The solution in a candidate folder, sources taken from its files; None without solution.json."""
    meta = folder / SOLUTION_FILE
    if not meta.is_file():
        return None
    solution = load_solution(meta)
    sources = {}
    for rel in solution.sources:
        file = folder / rel
        if not file.is_file():
            raise SpecError(f"{folder}: source {rel} named in {SOLUTION_FILE} is missing")
        sources[rel] = file.read_text()
    raw = dict(solution.raw)
    raw["sources"] = [{"path": rel, "content": text} for rel, text in sources.items()]
    return parse_solution(raw, str(meta))
