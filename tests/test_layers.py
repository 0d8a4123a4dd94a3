"""The import graph of ``evolve/``: no import cycle, and no module imports from a layer above its own.

The layers, lowest first, are written once here; the README's "Layout" paragraph describes them.
Every import counts, including those inside functions, except imports made only for type
annotations (under ``if TYPE_CHECKING:``). Importing ``evolve.a.b`` also imports the package
``evolve.a``, so that edge is added too; the root package ``evolve`` (the public API, a
facade over the layers) is the exception.
"""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "evolve"

# Lowest first; a name is the first part after ``evolve.`` (a module or a subpackage). Modules
# named here that do not exist yet take their place when they are written.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("types", "settings", "paths", "lifetime"),
    ("store",),
    ("sandbox",),
    ("harness",),
    ("query",),
    ("llm",),
    ("archive",),
    ("operators",),
    ("research",),
    ("backends",),
    ("search",),
    ("launch",),
    ("cli", "__main__", ""),  # "": the package itself (the public API)
    ("browse",),
)
LAYER = {name: index for index, names in enumerate(LAYERS) for name in names}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The evolve modules that module ``name`` (at ``path``) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:
            full = f"{base}.{alias.name}"
            targets.add(full if full in known else base)
    edges = set()
    for target in targets:
        while target and target not in known:  # evolve.x.attr -> evolve.x
            target = target.rpartition(".")[0]
        if target.startswith("evolve"):
            edges.add(target)
            parts = target.split(".")
            edges.update(".".join(parts[:i]) for i in range(2, len(parts)))  # its packages
    # the packages this module lies in are being imported already when it runs
    edges -= {name, *(".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1))}
    return edges


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imported(name, path, set(found)) for name, path in found.items()}


def layer_of(module: str) -> int:
    key = module.split(".")[1] if "." in module else ""
    if key not in LAYER:
        raise AssertionError(
            f"{module} is in no layer: add {key!r} to LAYERS in tests/test_layers.py "
            "(and to the README's Layout)"
        )
    return LAYER[key]


def test_every_module_has_a_layer():
    for module in modules():
        layer_of(module)


def test_no_import_cycle():
    sorter = graphlib.TopologicalSorter(graph())
    try:
        sorter.prepare()
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle: {' -> '.join(exc.args[1])}")


def test_imports_go_only_downward():
    upward = {
        (module, target)
        for module, targets in graph().items()
        for target in targets
        if layer_of(target) > layer_of(module)
    }
    unexplained = sorted(upward)
    assert not unexplained, "imports from a lower layer to a higher one:\n" + "\n".join(
        f"  {a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)})" for a, b in unexplained
    )


def test_the_graph_sees_imports_inside_functions_but_not_type_only_ones(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from evolve.types import Candidate\n"
        "if TYPE_CHECKING:\n    from evolve.search.driver import Summary\n"
        "def f():\n    from evolve.llm.client import LLMClient\n"
    )
    known = set(modules())
    assert imported("evolve.probe", source, known) == {
        "evolve.types",
        "evolve.llm.client",
        "evolve.llm",
    }


def test_importing_evolve_starts_nothing_heavy_and_exports_its_api():
    code = (
        "import sys, evolve\n"
        "heavy = ('litellm', 'torch', 'hydra', 'omegaconf', 'matplotlib', 'networkx', 'tqdm', 'datasette')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)), "
        "[m for m in sys.modules if m.startswith('evolve.')])\n"
        "print(all(hasattr(evolve, name) for name in evolve.__all__))\n"
        "import evolve.archive.grid, evolve.store.database, evolve.harness.fitness\n"
        "print(evolve.Archive is evolve.archive.grid.Archive and evolve.Store is evolve.store.database.Store)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True, check=True
    )
    assert result.stdout.split("\n")[:3] == ["[] []", "True", "True"]
