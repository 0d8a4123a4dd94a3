"""The tree of ``evolve/`` in numbers: modules per package, the longest import chain, the largest module.

The import graph is the one ``tests/test_layers.py`` checks (every import, those inside
functions too; importing ``evolve.a.b`` also runs the package ``evolve.a``). Give ``--root``
another checkout's ``evolve/`` folder to measure it the same way, e.g. the tree before a change:

    git archive HEAD~3 evolve | tar -x -C /tmp/before
    python scripts/tree_stats.py --root /tmp/before/evolve
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests/ is not installed

from tests.test_layers import PACKAGE, graph, modules  # noqa: E402


def package_of(path: Path, root: Path) -> str:
    """The top-level package a file lies in (``store/``), or ``evolve/`` for a top-level module."""
    parts = path.relative_to(root).parts
    return f"{parts[0]}/" if len(parts) > 1 else "evolve/ (top level)"


def longest_chain(edges: dict[str, set[str]]) -> list[str]:
    """The longest path through the (acyclic) import graph, importer first."""

    @functools.cache
    def chain(module: str) -> tuple[str, ...]:
        below = [chain(target) for target in edges[module] if target in edges]
        return (module, *max(below, key=len, default=()))

    return list(max((chain(m) for m in edges), key=len))


def room(module: str) -> str:
    """The room of ``evolve/`` a module is in: its top-level package, or itself at the top level."""
    return module.split(".")[1] if "." in module else "evolve"


def by_package(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between the rooms of ``evolve/``."""
    rooms: dict[str, set[str]] = {}
    for module, targets in edges.items():
        rooms.setdefault(room(module), set()).update(room(t) for t in targets)
    return {name: targets - {name} for name, targets in rooms.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=PACKAGE, help="an evolve/ folder")
    root = parser.parse_args().root.resolve()
    found = modules(root)
    counts = Counter(package_of(path, root) for path in found.values())
    print(f"{len(found)} modules (files, __init__ included) in {root}")
    for package, n in sorted(counts.items()):
        print(f"  {package:<22} {n}")
    edges = graph(root)
    chain = longest_chain(edges)
    print(f"longest import chain between modules: {len(chain)} floors")
    print("  " + " -> ".join(m.removeprefix("evolve.") for m in chain))
    rooms = longest_chain(by_package(edges))
    print(f"longest import chain between packages and top-level modules: {len(rooms)} floors")
    print("  " + " -> ".join(rooms))
    sizes = {m: len(p.read_text().splitlines()) for m, p in found.items()}
    largest = max(sizes, key=sizes.__getitem__)
    print(f"largest module: {largest} ({sizes[largest]} lines)")


if __name__ == "__main__":
    main()
