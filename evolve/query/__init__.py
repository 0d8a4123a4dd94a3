"""The read model: every read-only SQL query about a run's archive, shared by lineage, plots and browse.

``edges`` reads the lineage (parents, children, primary paths), ``run`` the run as a whole
(objective, best, counts, cost, the stats series, the grid), ``candidates`` single
candidates and the elites. Every function takes an open ``sqlite3.Connection`` or a
``Store`` and writes nothing; the store is the only writer.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from typing import Any

from evolve.store.database import Store

__all__ = ["Source", "connection", "loads", "marks"]

Source = sqlite3.Connection | Store


def connection(source: Source) -> sqlite3.Connection:
    """The connection behind ``source``."""
    return source.conn if isinstance(source, Store) else source


def marks(values: Iterable[Any]) -> str:
    """``?,?,?``: one SQL parameter per value."""
    return ",".join("?" for _ in values)


def loads(text: str | None, default: Any) -> Any:
    """JSON stored in a column, or ``default`` when it is empty or not JSON."""
    if not text:
        return default
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return default
