"""Forget what earlier commands left in the host's page cache, before a strict re-evaluation.

The sandbox refuses the calls that read or steer page-cache residency (``evolve.sandbox.channels``),
but a command still loads the pages it reads, and a later one can tell a cached page from an
uncached one by how it reads: its major-fault count (``getrusage``) or the time a read takes.
So one evaluation can leave bits for the next in which pages of a large readable file are
cached. The auditor's strict re-evaluation of a would-be best (``EvalContext.strict``) runs
after ``forget``, so nothing an earlier evaluation planted there reaches it.

Facts used (the kernel's ``Documentation/admin-guide/sysctl/vm.rst``, ``posix_fadvise(2)``):
writing 1 to ``/proc/sys/vm/drop_caches`` (root) frees the clean page cache of every file;
dirty pages stay, so ``sync`` runs first; pages some process maps stay. Without that file,
``POSIX_FADV_DONTNEED`` frees a file's clean, unmapped pages, for any file one may read.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence

DROP_CACHES = "/proc/sys/vm/drop_caches"


def forget(roots: Sequence[str] = ()) -> str:
    """Free the clean page cache: all of it as root, else of the files beneath ``roots`` and this
    Python installation's folders; say what was done (``NOT`` first when not all of it)."""
    os.sync()
    try:
        with open(DROP_CACHES, "w") as handle:
            handle.write("1")
        return f"every file's clean pages dropped ({DROP_CACHES})"
    except OSError as exc:
        refused = exc
    folders = {*roots, sys.prefix, sys.base_prefix, *(p for p in sys.path if os.path.isdir(p))}
    advised = 0
    for root in sorted(folders):
        for folder, _, files in os.walk(root):
            for name in files:
                with contextlib.suppress(OSError):
                    fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW)
                    try:
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                        advised += 1
                    finally:
                        os.close(fd)
    return (
        f"NOT every file's: {DROP_CACHES} refused ({refused.strerror}); clean pages of "
        f"{advised} files beneath {len(folders)} folders dropped (POSIX_FADV_DONTNEED)"
    )
