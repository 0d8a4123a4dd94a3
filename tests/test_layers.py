"""The import graph of ``evolve/``: no import cycle, and no module imports from a layer above its own.

The layers, lowest first, are written once here, by package (a name is a package, or one of
the few modules at the top: the entry points and what every layer shares); the README's
"Layout" tree shows them in this order, and a test here checks that tree against the disk.
Every import counts, including those inside functions, except imports made only for type
annotations (under ``if TYPE_CHECKING:``). Importing ``evolve.a.b`` also imports the package
``evolve.a``, so that edge is added too; the root package ``evolve`` (the public API, a
facade over the layers) is the exception.
"""

from __future__ import annotations

import ast
import graphlib
import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "evolve"

# Lowest first; a name is the first part after ``evolve.`` (a module or a subpackage). Modules
# named here that do not exist yet take their place when they are written.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("types", "settings", "paths", "exports"),
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
SHARED = LAYERS[0]  # the modules every layer shares, at the top of evolve/
ENTRY = ("cli", "__main__")  # and the entry points beside the package's own __init__
README = PACKAGE.parent / "README.md"


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the ``evolve`` folder ``package`` (this checkout's, or another's), by name."""
    return {module_name(p, package): p for p in sorted(package.rglob("*.py"))}


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


def graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module of ``package`` and the evolve modules it imports."""
    found = modules(package)
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
    assert result.stdout.split("\n")[:3] == ["[] ['evolve.exports']", "True", "True"]


def test_the_top_level_holds_only_the_entry_points_and_the_shared_modules():
    top = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert top == {*SHARED, *ENTRY}, (
        "evolve/ holds modules outside any package: move them into the package of their layer "
        "(or, when every layer uses them, add them to LAYERS[0])"
    )


def _packages() -> list[Path]:
    return sorted(p.parent for p in PACKAGE.glob("*/__init__.py"))


@pytest.mark.parametrize("folder", _packages(), ids=lambda p: p.name)
def test_every_package_says_its_job_in_one_line_and_lists_its_public_names(folder):
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
    first = doc.split("\n")[0]
    assert first.endswith((".", ")")), f"{folder.name}/__init__.py: open with a one-line docstring"
    package = importlib.import_module(f"evolve.{folder.name}")
    assert package.__all__, f"{folder.name}/__init__.py: list the package's public names in __all__"
    for name in package.__all__:
        if importlib.util.find_spec(f"{package.__name__}.{name}") is None:  # else a module
            getattr(package, name)


def layout_tree(readme: str) -> list[tuple[int, list[str]]]:
    """The README's Layout tree: each line's indent and its names (a package ends in '/')."""
    section = readme.split("### Layout", 1)[1]
    block = re.search(r"```text\n(.*?)```", section, re.S)
    assert block, "the README's Layout section holds the tree in a ```text block"
    rows = []
    for line in block.group(1).splitlines():
        names = line.split("#", 1)[0].split()
        if names:
            rows.append((len(line) - len(line.lstrip()), names))
    return rows


def test_the_readme_layout_is_the_tree_in_layer_order():
    rows = layout_tree(README.read_text())
    assert rows[0] == (0, ["evolve/"])
    listed: dict[str, set[str]] = {}
    folders: list[tuple[int, str]] = [(0, "")]
    order: list[str] = []
    for indent, names in rows[1:]:
        while folders[-1][0] >= indent:
            folders.pop()
        parent = folders[-1][1]
        if names[0].endswith("/"):
            folder = f"{parent}{names[0]}"
            folders.append((indent, folder))
            listed.setdefault(folder, set())
        else:
            listed.setdefault(parent, set()).update(names)
        if not parent:
            order += [names[0].rstrip("/").removesuffix(".py").replace("__init__", "")]
    on_disk = {
        str(init.parent.relative_to(PACKAGE)) + "/" if init.parent != PACKAGE else "": {
            p.name for p in init.parent.glob("*.py")
        }
        for init in PACKAGE.rglob("__init__.py")
    }
    for folder in on_disk:
        on_disk[folder] -= {"__init__.py"} if folder else set()
    assert listed == on_disk, "the README's Layout tree differs from evolve/ on disk"
    layers = [layer_of(f"evolve.{name}" if name else "evolve") for name in order]
    assert layers == sorted(layers), f"the README's Layout rows are not in layer order: {order}"
    assert {n for names in LAYERS for n in names} <= {*order, *SHARED, *ENTRY}


BENCHMARKS = PACKAGE.parent / "benchmarks"


def _benchmark_sources() -> list[Path]:
    """The benchmarks' modules, less the seed programs (a candidate's own scripts)."""
    return [
        p for p in sorted(BENCHMARKS.rglob("*.py")) if "seed" not in p.relative_to(BENCHMARKS).parts
    ]


def test_benchmarks_import_each_other_relatively_and_every_import_is_a_file():
    for path in _benchmark_sources():
        for node in _imports(ast.parse(path.read_text(), str(path))):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
            )
            if not getattr(node, "level", 0):
                assert not any(n.startswith("evolve.benchmarks") for n in names), (
                    f"{path.relative_to(BENCHMARKS)}:{node.lineno}: import other benchmark modules "
                    "relatively (from .runner import ..., from ..gpu_script import ...)"
                )
                continue
            folder = path.parent
            for _ in range(node.level - 1):
                folder = folder.parent
            assert BENCHMARKS in (folder, *folder.parents), (
                f"{path}:{node.lineno} leaves benchmarks/"
            )
            target = folder.joinpath(*(node.module or "").split(".")) if node.module else folder
            modules = [target] if node.module else [folder / alias.name for alias in node.names]
            for module in modules:
                assert module.with_suffix(".py").is_file() or (module / "__init__.py").is_file(), (
                    f"{path.relative_to(BENCHMARKS)}:{node.lineno}: no file for {module}"
                )


def test_the_harness_imports_evolve_names_from_their_modules_so_its_hash_covers_them():
    """A lazily exported name (``from evolve.archive import Samples``) loads a module that the
    harness hash, which follows imports, does not see; the harness names the module itself."""
    for path in [*_benchmark_sources(), *sorted((PACKAGE / "harness").glob("*.py"))]:
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom) or node.level or node.module is None:
                continue
            if not node.module.startswith("evolve") or node.module.startswith("evolve.benchmarks"):
                continue
            package = importlib.import_module(node.module)
            if "__getattr__" not in vars(package):
                continue
            for alias in node.names:
                assert importlib.util.find_spec(f"{node.module}.{alias.name}"), (
                    f"{path.name}:{node.lineno}: import {alias.name} from its module "
                    f"(e.g. from {node.module}.<module> import {alias.name})"
                )
