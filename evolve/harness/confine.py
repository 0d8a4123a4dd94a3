"""Hiding paths from a harness process's child: a Landlock layer on reads, stacked on the sandbox's own.

A harness process (the training supervisor) must read data that the candidate it runs must
not (the training split, streamed by the harness only while its clock runs). Landlock
layers stack: the child restricts itself further, between fork and exec, so that neither it
nor its descendants can read the hidden paths by any means, native code included. The grants
are planned in the parent: an entry created later directly inside a directory on the way to a
hidden path (not below a granted sibling) is unreadable to the child too. Where the kernel has
no Landlock this does nothing (``hide_reads`` returns None).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence

from evolve.sandbox import landlock
from evolve.sandbox.channels import libc
from evolve.sandbox.isolation import PR_SET_NO_NEW_PRIVS


def hide_reads(paths: Sequence[str]) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes ``paths`` unreadable to the child; None without Landlock or paths.

    The read grants (everything but ``paths``) are computed now, in the parent.
    """
    hidden = [os.path.realpath(p) for p in paths if p]
    abi = landlock.abi()
    if not hidden or abi < 1:
        return None
    rules = landlock.read_rules(hidden)

    def restrict() -> None:
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(NO_NEW_PRIVS)")
        landlock.restrict(abi, None, rules, tcp=False, scoped=False)

    return restrict
