"""Hashing: files by SHA-256, and the harness's own source, computed from what a fitness imports.

``harness_modules`` walks the imports of a fitness's module (and the modules it starts as
``python -m NAME``, found as string constants) within ``evolve`` and the fitness's own
top-level package, so the harness hash covers every module that defines the measurement
without anyone keeping a list.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import re
from collections.abc import Iterable
from pathlib import Path

CHUNK = 1 << 20
MODULE_NAME = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)+$")


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _source(name: str) -> Path | None:
    """The .py file of module ``name`` (a package's __init__.py), or None when not a source module."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin).resolve()


def _named(tree: ast.AST, package: str | None) -> Iterable[str]:
    """Module names that ``tree`` imports, or names as strings (``-m`` targets)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level and package is not None:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and MODULE_NAME.match(node.value)
        ):
            yield node.value


def harness_modules(root: str, *, within: Iterable[str] = ("evolve",)) -> list[Path]:
    """Source files of ``root`` and of every module it imports, transitively, inside ``within``.

    Args:
        root: a module name, e.g. a fitness class's ``__module__``.
        within: top-level packages followed (others, e.g. torch, are not the harness); the
            root's own top-level package is always followed.
    """
    keep = {*within, root.split(".")[0]}
    seen: dict[str, Path] = {}
    todo = [root]
    while todo:
        name = todo.pop()
        if name in seen or name.split(".")[0] not in keep:
            continue
        path = _source(name)
        if path is None:
            continue
        seen[name] = path
        parts = name.split(".")
        parents = [".".join(parts[:i]) for i in range(1, len(parts))]
        package = name if path.name == "__init__.py" else ".".join(parts[:-1]) or None
        todo += parents
        todo += _named(ast.parse(path.read_bytes()), package)
    return sorted(set(seen.values()))


def files_digest(paths: Iterable[Path], *, root: Path | None = None) -> str:
    """SHA-256 over files' names (relative to ``root`` when given) and bytes, in sorted order."""
    digest = hashlib.sha256()
    for path in sorted(set(paths)):
        name = str(path.relative_to(root)) if root and path.is_relative_to(root) else path.name
        digest.update(name.encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()
