"""Copies, made by the harness, of files a sandboxed program wrote: plain files of their own only, never through a link."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path


def copy_plain(source: Path, target: Path, *, dir_fd: int | None = None) -> bool:
    """Copy ``source`` (relative to ``dir_fd`` when given) to ``target`` through one descriptor;
    False, with nothing written, unless it is a regular file with one link and not a symlink.

    A program that wrote ``source`` could make it a symlink or a hard link to a file hidden
    from it (validation data) for the harness to copy where the next sandbox reads it: the
    file is opened without following a link and checked on that descriptor, so what is copied
    is the file checked, whatever the name points to meanwhile."""
    try:
        handle = os.open(source, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return False
    info = os.fstat(handle)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(handle)
        return False
    with os.fdopen(handle, "rb") as reader, open(target, "wb") as writer:
        shutil.copyfileobj(reader, writer)
    return True


def copy_folder(folder: Path, target: Path, keep: Callable[[str], bool]) -> list[str] | None:
    """Copy the files of ``folder`` whose names ``keep`` accepts into ``target`` (``copy_plain``
    each, the folder itself opened without following a link); their names, or None when the
    folder or one of them is not plain (``target`` may then hold part of the copy)."""
    try:
        handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        names = sorted(name for name in os.listdir(handle) if keep(name))
        target.mkdir(parents=True, exist_ok=True)
        for name in names:
            if not copy_plain(Path(name), target / name, dir_fd=handle):
                return None
        return names
    finally:
        os.close(handle)
