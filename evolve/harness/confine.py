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

from evolve import isolation

RULESET_FS_ONLY = 8  # bytes of the ruleset attribute the kernel reads: handled_access_fs only


def hide_reads(paths: Sequence[str]) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes ``paths`` unreadable to the child; None without Landlock or paths.

    The read grants (everything but ``paths``) are computed now, in the parent.
    """
    hidden = [os.path.realpath(p) for p in paths if p]
    if not hidden or isolation.landlock_abi() < 1:
        return None
    rules = isolation._read_rules(hidden)
    libc = isolation._libc

    def restrict() -> None:
        if libc.prctl(isolation.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(NO_NEW_PRIVS)")
        attr = isolation._RulesetAttr(isolation.FS_READ, 0, 0)
        ruleset = libc.syscall(
            isolation.SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), RULESET_FS_ONLY, 0
        )
        if ruleset < 0:
            raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
        for path, is_dir, rights in rules:
            allowed = rights if is_dir else rights & isolation.FS_FILE_ONLY
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # vanished since the plan: nothing to grant
            rule = isolation._PathBeneath(allowed, fd)
            libc.syscall(
                isolation.SYS_LANDLOCK_ADD_RULE,
                ruleset,
                isolation.LANDLOCK_RULE_PATH_BENEATH,
                ctypes.byref(rule),
                0,
            )
            os.close(fd)
        if libc.syscall(isolation.SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
        os.close(ruleset)

    return restrict
