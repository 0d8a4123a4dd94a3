"""Hashing: files by SHA-256, and the harness's own source, computed from what a fitness imports.

``harness_modules`` walks the imports of a fitness's module (and the modules it starts as
``python -m NAME``, found as string constants) within ``evolve`` and the fitness's own
top-level package, so the harness hash covers every module that defines the measurement
without anyone keeping a list.
"""

from __future__ import annotations

import ast
import functools
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


def _type_checking(node: ast.AST) -> bool:
    """Whether ``node`` is ``if TYPE_CHECKING:`` (imports for annotations only, never run)."""
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _nodes(tree: ast.AST, *, functions: bool) -> Iterable[ast.AST]:
    """Every node of ``tree`` outside ``if TYPE_CHECKING:`` blocks (and function bodies, unless ``functions``)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if not functions and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if _type_checking(node):
            todo += node.orelse
        else:
            todo += ast.iter_child_nodes(node)


def _named(tree: ast.AST, package: str | None, *, init: bool) -> Iterable[str]:
    """Module names that ``tree`` imports at run time, and names as strings (``-m`` targets).

    A package's ``__init__`` (``init``) counts only what it imports when the package loads: it
    starts no harness process, and names it loads lazily (inside functions, or as strings in
    a table) are not part of what its submodules run.
    """
    for node in _nodes(tree, functions=not init):
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
            not init
            and isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and MODULE_NAME.match(node.value)
        ):
            yield node.value


def harness_modules(root: str, *, within: Iterable[str] = ("evolve",)) -> list[Path]:
    """Source files of ``root`` and of every module it imports, transitively, inside ``within``.

    The set is found once per process (the files' contents are what the harness hash reads
    each time): parsing again before every evaluation cost time, and ``ast.parse`` while
    other threads compile code fails on CPython before 3.11.8 and 3.12.2 ("AST constructor
    recursion depth mismatch", CPython gh-106905).

    Args:
        root: a module name, e.g. a fitness class's ``__module__``.
        within: top-level packages followed (others, e.g. torch, are not the harness); the
            root's own top-level package is always followed.
    """
    return list(_modules(root, tuple(within)))


@functools.cache
def _modules(root: str, within: tuple[str, ...]) -> tuple[Path, ...]:
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
        todo += _named(ast.parse(path.read_bytes()), package, init=path.name == "__init__.py")
    return tuple(sorted(set(seen.values())))


def files_digest(paths: Iterable[Path], *, root: Path | None = None) -> str:
    """SHA-256 over files' names (relative to ``root`` when given) and bytes, in sorted order."""
    digest = hashlib.sha256()
    for path in sorted(set(paths)):
        name = str(path.relative_to(root)) if root and path.is_relative_to(root) else path.name
        digest.update(name.encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()
