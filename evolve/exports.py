"""A package's public names, each imported from its module on first use (PEP 562): importing a package runs nothing."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy(
    package: str, homes: Mapping[str, str]
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``__all__``, ``__getattr__`` and ``__dir__`` for ``package``, whose public names live in ``homes``.

    In a package's ``__init__``: ``__all__, __getattr__, __dir__ = lazy(__name__, HOMES)``.
    Importing the package then imports none of its modules; ``from package import Name``
    imports ``Name``'s module only.

    Args:
        package: the package's ``__name__``.
        homes: each public name and the module that defines it, e.g.
            ``{"Store": "evolve.store.database"}``.
    """

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *homes})

    return list(homes), __getattr__, __dir__
