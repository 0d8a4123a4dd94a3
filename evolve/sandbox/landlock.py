"""Landlock for the sandboxed child: confine writes and reads, refuse TCP, scope signals and sockets.

Facts used (the kernel's Landlock documentation): Landlock (Linux >= 5.13) restricts
filesystem access of the calling thread and its descendants; ABI 2 adds file renames across
folders (refer), ABI 3 truncation, ABI 4 TCP bind/connect, ABI 6 scopes signals and
abstract unix sockets to the sandbox's domain. A Landlocked process cannot ptrace (nor read
``/proc/<pid>/environ`` of) processes outside its domain, nor change its mounts.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Sequence

from evolve.sandbox.channels import check, libc, within

SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION, LANDLOCK_RULE_PATH_BENEATH = 1, 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1, 2, 4, 8
FS_REFER, FS_TRUNCATE = 1 << 13, 1 << 14
FS_ABI1_ALL = (1 << 13) - 1  # execute .. make_sym
FS_READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
FS_FILE_ONLY = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE
NET_TCP = 1 | 2  # bind | connect
SCOPE_ALL = 1 | 2  # abstract unix sockets | signals


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("fd", ctypes.c_int32)]


def abi() -> int:
    """The Landlock ABI version this kernel offers to this process (0 when unavailable)."""
    version = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    return max(int(version), 0)


def read_rules(hidden: Sequence[str]) -> tuple[tuple[str, bool, int], ...]:
    """Read grants covering the whole tree except ``hidden``: siblings along each path to it.

    Each directory on the way to a hidden path may be listed (Python's import system lists
    every ``sys.path`` entry), which lets the command see the *names* under it, hidden ones
    included, but never read a hidden file.
    """
    rules: list[tuple[str, bool, int]] = []

    def walk(directory: str) -> None:
        rules.append((directory, True, FS_READ_DIR))
        with contextlib.suppress(OSError), os.scandir(directory) as entries:
            for entry in entries:
                real = os.path.realpath(entry.path)
                if any(within(real, h) for h in hidden):
                    continue  # hidden itself, or a link into it
                if any(within(h, real) for h in hidden):
                    if entry.is_dir(follow_symlinks=False):
                        walk(entry.path)
                    continue  # a link to an ancestor of a hidden path cannot be granted
                rules.append((entry.path, entry.is_dir(), FS_READ))

    walk("/")
    return tuple(rules)


def restrict(
    abi: int,
    writes: Sequence[tuple[str, bool]] | None,
    reads: Sequence[tuple[str, bool, int]] | None,
    *,
    tcp: bool,
    scoped: bool = True,
) -> str:
    """Restrict this process with Landlock; return what was restricted.

    Args:
        abi: the kernel's Landlock ABI (``abi()``).
        writes: (path, is_dir) granted every right; None leaves writes unrestricted.
        reads: (path, is_dir, rights) read grants (``read_rules``); None leaves reads open.
        tcp: refuse TCP bind and connect (ABI >= 4).
        scoped: scope signals and abstract unix sockets to this domain (ABI >= 6).
    """
    fs = FS_ABI1_ALL | (FS_REFER if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0)
    if writes is None:
        # A layer that does not handle refer forbids every rename across folders (ABI 1
        # semantics), which breaks compilers' caches; handled and granted everywhere, it
        # forbids only moves that would make a file readable that was not.
        fs &= FS_READ | FS_REFER
    if reads is None:
        fs &= ~FS_READ
    attr = _RulesetAttr(
        fs, NET_TCP if tcp and abi >= 4 else 0, SCOPE_ALL if scoped and abi >= 6 else 0
    )
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    if not (attr.fs or attr.net or attr.scoped):
        return "nothing to restrict"
    ruleset = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), size, 0)
    check(0 if ruleset >= 0 else -1, "landlock_create_ruleset")
    grants = [(p, d, fs) for p, d in writes or ()]
    if writes is None and fs & FS_REFER:
        grants.append(("/", True, FS_REFER))
    grants += [(p, d, fs & rights) for p, d, rights in reads or ()]
    for path, is_dir, rights in grants:
        allowed = rights if is_dir else rights & FS_FILE_ONLY
        if not allowed:
            continue
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue  # vanished since plan(): nothing to grant
        rule = _PathBeneath(allowed, fd)
        result = libc.syscall(
            SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0
        )
        os.close(fd)
        check(0 if result == 0 else -1, f"landlock_add_rule({path})")
    check(libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    os.close(ruleset)
    parts = ["writes" if fs & FS_WRITE_FILE else "", "reads" if fs & FS_READ_FILE else ""]
    parts += ["tcp" if attr.net else "", "signals+abstract sockets" if attr.scoped else ""]
    return f"ABI {abi}: " + ", ".join(p for p in parts if p)
