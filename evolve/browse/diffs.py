"""Unified diffs between candidates' file sets (the CLI's ``diff`` and the candidate page share them)."""

from __future__ import annotations

import difflib

from evolve.query import Source
from evolve.query.candidates import files_of


def diff_files(
    old: dict[str, str], new: dict[str, str], *, old_name: str, new_name: str, context: int = 3
) -> str:
    """A unified diff between two file sets (files added or removed included); empty when equal."""
    chunks = []
    for path in sorted(set(old) | set(new)):
        a, b = old.get(path), new.get(path)
        if a == b:
            continue
        chunks += difflib.unified_diff(
            (a or "").splitlines(keepends=True),
            (b or "").splitlines(keepends=True),
            fromfile=f"{old_name}/{path}" if a is not None else "/dev/null",
            tofile=f"{new_name}/{path}" if b is not None else "/dev/null",
            n=context,
        )
    return "".join(line if line.endswith("\n") else line + "\n" for line in chunks)


def diff(source: Source, old_id: str, new_id: str, *, context: int = 3) -> str:
    """The unified diff from candidate ``old_id`` to candidate ``new_id``."""
    return diff_files(
        files_of(source, old_id),
        files_of(source, new_id),
        old_name=old_id[:10],
        new_name=new_id[:10],
        context=context,
    )
