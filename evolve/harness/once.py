"""A value measured once per machine and key: the first process to ask measures it, the others wait.

For what a harness measures of its own seed program and reuses across evaluations and worker
processes (the seed's reference values, a compile cache filled by the seed): the value is a
JSON file, written atomically under a file lock, so workers that ask at the same time wait
for the first one and then read its record.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def key(facts: dict[str, Any]) -> str:
    """A short name for a stored value: the digest of everything that decides it (JSON)."""
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:24]


def stored(path: Path, measure: Callable[[], Any]) -> Any:
    """The JSON value at ``path``; the first process to ask measures it (``measure()``) and
    writes it while the others wait on a lock, then read it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            return json.loads(path.read_text())
        value = measure()
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(value))
        os.replace(partial, path)
        return value
