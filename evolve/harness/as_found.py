"""A folder left as it was found: what a run in it adds is removed and what it changes is put back.

A benchmark whose quick stages run the candidate's program in the folder the full run uses
(nanochat's short run trains there on real rows) wraps them in ``as_found``: the full run then
starts from the candidate's files, never from weights or data a quick stage left there
(its own files, or its HOME under the sandbox's ``.sandbox``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path


def _entries(folder: Path) -> tuple[dict[Path, bytes], set[Path]]:
    """The files (their bytes) and folders under ``folder``; links are neither followed nor kept."""
    files, folders = {}, set()
    for root, names, leaves in os.walk(folder):
        here = Path(root)
        folders.update(here / n for n in names if not (here / n).is_symlink())
        for name in leaves:
            path = here / name
            if path.is_file() and not path.is_symlink():
                files[path] = path.read_bytes()
    return files, folders


@contextlib.contextmanager
def as_found(folder: Path) -> Iterator[None]:
    """After the block, ``folder`` holds exactly the files and folders it held before, with their bytes."""
    files, folders = _entries(folder)
    try:
        yield
    finally:
        for root, names, leaves in os.walk(folder, topdown=True):
            here = Path(root)
            for name in list(names):
                path = here / name
                if path not in folders or path.is_symlink():
                    names.remove(name)  # not walked into: removed whole
                    if path.is_symlink():
                        path.unlink()
                    else:
                        shutil.rmtree(path, ignore_errors=True)
            for name in leaves:
                path = here / name
                if path not in files or path.is_symlink() or path.read_bytes() != files[path]:
                    path.unlink()
        for path in sorted(folders):
            path.mkdir(parents=True, exist_ok=True)
        for path, data in files.items():
            if not path.is_file():
                path.write_bytes(data)
