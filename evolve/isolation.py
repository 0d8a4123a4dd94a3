"""Linux isolation for sandboxed commands: namespaces, Landlock, read-only binds, no capabilities.

``plan()`` runs in the parent and resolves a ``Policy`` into paths and flags; ``apply()``
runs in the child between fork and exec and reports, key by key, what it really applied.
Each protection degrades on its own when the platform refuses it, and the report says so
(values starting with ``NOT``); ``Policy(strict=True)`` refuses to run instead.

Facts used (Linux man pages and the kernel's Landlock documentation):
- ``unshare(CLONE_NEWNET)`` needs CAP_SYS_ADMIN; unprivileged users get it inside a new user
  namespace (``CLONE_NEWUSER``) that maps only their own uid and gid.
- Landlock (Linux >= 5.13) restricts filesystem access of the calling thread and its
  descendants; ABI 4 adds TCP bind/connect, ABI 6 scopes signals and abstract unix sockets.
  A Landlocked process cannot ptrace (nor read ``/proc/<pid>/environ`` of) processes outside
  its domain, nor change its mounts.
- A process whose capability bounding set is empty gains no capability at execve, even as root.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import glob
import os
import socket
import struct
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND = 1, 2, 4, 32, 4096
MS_REC, MS_PRIVATE = 16384, 1 << 18
_KEEP_MOUNT_FLAGS = {2: 2, 4: 4, 8: 8, 1024: 1024, 2048: 2048, 4096: 1 << 21}  # ST_* -> MS_*
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION, LANDLOCK_RULE_PATH_BENEATH = 1, 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1, 2, 4, 8
FS_REFER, FS_TRUNCATE = 1 << 13, 1 << 14
FS_ABI1_ALL = (1 << 13) - 1  # execute .. make_sym
FS_READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
FS_FILE_ONLY = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE
NET_TCP = 1 | 2  # bind | connect
SCOPE_ALL = 1 | 2  # abstract unix sockets | signals
DEFAULT_DEVICES = (
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/nvidia*",
)
NOT = "NOT "  # report values that start with this name a protection that was not applied


class IsolationError(RuntimeError):
    """A protection that ``Policy(strict=True)`` asked for could not be applied."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("fd", ctypes.c_int32)]


@dataclass(frozen=True, kw_only=True)
class Policy:
    """What a sandboxed command may touch besides its working directory.

    Attributes:
        network: allow the network. Default False: a private network namespace holding only
            its own loopback (so torchrun/NCCL inside one evaluation still work), else Landlock
            refusing TCP bind/connect, else a warning.
        writable: extra paths the command may write (a shared Triton cache, ``/dev/shm`` for
            NCCL or DataLoader workers). The working directory is always writable.
        readonly: paths that stay read-only even inside the working directory (harness
            files), by a read-only bind mount; changes are also detected after the run.
        hidden: paths the command may not read at all (validation data, the run's archive,
            credentials). Needs Landlock. Must not contain the working directory.
        devices: glob patterns of device files the command may open for writing; the default
            covers the usual character devices and every ``/dev/nvidia*`` node.
        confine_writes: refuse writes outside the writable paths (Landlock).
        drop_caps: empty the capability bounding set, so that a command started as root holds
            no capability (cannot mount, leave its namespaces, load modules, ...).
        private_home: point HOME and TMPDIR at fresh directories inside the working directory,
            so caches (~/.triton, torchinductor's temp dir) land there.
        private_shm: give the command an empty, writable tmpfs on ``/dev/shm`` of its own
            (NCCL and DataLoader workers need it; it vanishes with the command). Needs a
            mount namespace; without one /dev/shm stays read-only unless listed in ``writable``.
        strict: raise ``IsolationError`` instead of running when any protection is missing.
    """

    network: bool = False
    writable: Sequence[str | Path] = ()
    readonly: Sequence[str | Path] = ()
    hidden: Sequence[str | Path] = ()
    devices: Sequence[str] = DEFAULT_DEVICES
    confine_writes: bool = True
    drop_caps: bool = True
    private_home: bool = True
    private_shm: bool = True
    strict: bool = False

    def __post_init__(self) -> None:
        for name in ("writable", "readonly", "hidden", "devices"):  # hashable, picklable
            object.__setattr__(self, name, tuple(str(p) for p in getattr(self, name)))


@dataclass(frozen=True)
class Plan:
    """A policy resolved in the parent to absolute paths, ready for ``apply()`` in the child."""

    policy: Policy
    write_rules: tuple[tuple[str, bool], ...]  # (path, is_dir)
    read_rules: tuple[tuple[str, bool, int], ...] | None  # (path, is_dir, rights); None: any
    readonly: tuple[str, ...]
    hidden: tuple[str, ...]
    blank: str  # the unreadable empty file bound over hidden files
    abi: int


def landlock_abi() -> int:
    """The Landlock ABI version this kernel offers to this process (0 when unavailable)."""
    version = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    return max(int(version), 0)


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _read_rules(hidden: Sequence[str]) -> tuple[tuple[str, bool, int], ...]:
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
                if any(_within(real, h) for h in hidden):
                    continue  # hidden itself, or a link into it
                if any(_within(h, real) for h in hidden):
                    if entry.is_dir(follow_symlinks=False):
                        walk(entry.path)
                    continue  # a link to an ancestor of a hidden path cannot be granted
                rules.append((entry.path, entry.is_dir(), FS_READ))

    walk("/")
    return tuple(rules)


def plan(policy: Policy, workdir: Path) -> Plan:
    """Resolve ``policy`` for a command running in ``workdir`` (runs in the parent)."""
    writable = [str(workdir.resolve())] + [os.path.realpath(p) for p in policy.writable]
    devices = sorted({path for pattern in policy.devices for path in glob.glob(pattern)})
    rules = tuple((p, os.path.isdir(p)) for p in [*writable, *devices] if os.path.exists(p))
    hidden = [os.path.realpath(p) for p in policy.hidden]
    return Plan(
        policy=policy,
        write_rules=rules,
        read_rules=_read_rules(hidden) if hidden else None,
        readonly=tuple(os.path.realpath(p) for p in policy.readonly if os.path.exists(p)),
        hidden=tuple(p for p in hidden if os.path.exists(p)),
        blank=_blank_file() if any(os.path.isfile(p) for p in hidden) else "",
        abi=landlock_abi(),
    )


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def _unshare(flags: int) -> str:
    """Enter new namespaces, through a user namespace when not privileged; say how."""
    if _libc.unshare(flags) == 0:
        return "own namespace"
    if ctypes.get_errno() != errno.EPERM:
        _check(-1, "unshare")
    uid, gid = os.geteuid(), os.getegid()
    _check(_libc.unshare(flags | CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    return "own namespace inside a user namespace"


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        flags = struct.unpack(
            "16sH", fcntl.ioctl(sock, SIOCGIFFLAGS, struct.pack("16sH", b"lo", 0))
        )[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP))


def _bind_readonly(path: str) -> None:
    keep = sum(ms for st, ms in _KEEP_MOUNT_FLAGS.items() if os.statvfs(path).f_flag & st)
    _check(_libc.mount(path.encode(), path.encode(), None, MS_BIND | MS_REC, None), f"bind {path}")
    flags = MS_BIND | MS_REMOUNT | MS_RDONLY | keep
    _check(_libc.mount(None, path.encode(), None, flags, None), f"remount {path} read-only")


def _guard_proc() -> bool:
    """In the command's mount namespace: /proc/sys read-only, /proc/sysrq-trigger covered."""
    try:
        _bind_readonly("/proc/sys")
        if os.path.exists("/proc/sysrq-trigger"):
            sysrq = b"/proc/sysrq-trigger"
            _check(_libc.mount(b"/dev/null", sysrq, None, MS_BIND, None), "cover sysrq-trigger")
    except OSError:
        return False
    return True


def _landlock(plan: Plan, net: bool, extra: list[str], restrict_reads: bool) -> str:
    """Restrict this process with Landlock; return what was restricted."""
    abi = plan.abi
    fs = FS_ABI1_ALL | (FS_REFER if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0)
    if not plan.policy.confine_writes:
        fs &= FS_READ
    if plan.read_rules is None or not restrict_reads:
        fs &= ~FS_READ
    attr = _RulesetAttr(fs, NET_TCP if net and abi >= 4 else 0, SCOPE_ALL if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    if not (attr.fs or attr.net or attr.scoped):
        return "nothing to restrict"
    ruleset = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), size, 0)
    _check(0 if ruleset >= 0 else -1, "landlock_create_ruleset")
    grants = [(p, d, fs) for p, d in plan.write_rules] + [(p, True, fs) for p in extra]
    grants += [(p, d, fs & rights) for p, d, rights in (plan.read_rules or ()) if restrict_reads]
    for path, is_dir, rights in grants:
        allowed = rights if is_dir else rights & FS_FILE_ONLY
        if not allowed:
            continue
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue  # vanished since plan(): nothing to grant
        rule = _PathBeneath(allowed, fd)
        result = _libc.syscall(
            SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0
        )
        os.close(fd)
        _check(0 if result == 0 else -1, f"landlock_add_rule({path})")
    _check(_libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    os.close(ruleset)
    parts = ["writes" if fs & FS_WRITE_FILE else "", "reads" if fs & FS_READ_FILE else ""]
    parts += ["tcp" if attr.net else "", "signals+abstract sockets" if attr.scoped else ""]
    return f"ABI {abi}: " + ", ".join(p for p in parts if p)


def _hide(path: str, blank: str) -> None:
    """Cover ``path``: an empty read-only tmpfs over a folder, the unreadable ``blank`` over a file."""
    if os.path.isdir(path):
        flags = MS_RDONLY | MS_NOSUID | MS_NODEV
        _check(_libc.mount(b"tmpfs", path.encode(), b"tmpfs", flags, b"mode=000"), f"hide {path}")
    else:
        _check(_libc.mount(blank.encode(), path.encode(), None, MS_BIND, None), f"hide {path}")


@functools.cache
def _blank_file() -> str:
    """An empty file nobody may read (mode 000), bound over hidden files."""
    handle, path = tempfile.mkstemp(prefix="evolve-hidden-")
    os.close(handle)
    os.chmod(path, 0)
    return path


def _mounts(plan: Plan, report: dict[str, str]) -> tuple[bool, bool]:
    """In a new mount namespace: a private /dev/shm, read-only binds and covered hidden paths.

    Returns (shm is private, every hidden path is covered).
    """
    shm = False
    with contextlib.suppress(OSError):
        _check(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
        if plan.policy.private_shm and os.path.isdir("/dev/shm"):
            flags = MS_NOSUID | MS_NODEV
            _check(
                _libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", flags, b"mode=1777"), "mount /dev/shm"
            )
            report["shm"], shm = "private tmpfs on /dev/shm", True
    done = []
    with contextlib.suppress(OSError):
        for path in plan.readonly:
            _bind_readonly(path)
            done.append(path)
    missing = len(plan.readonly) - len(done)
    if missing:
        report["readonly"] = (
            f"{NOT}enforced for {missing} of {len(plan.readonly)} path(s); checked after the run"
        )
    elif done:
        report["readonly"] = (
            f"read-only bind mounts ({len(done)} path(s)), also checked after the run"
        )
    covered = 0
    with contextlib.suppress(OSError):
        for path in plan.hidden:
            _hide(path, plan.blank)
            covered += 1
    if plan.hidden and covered == len(plan.hidden):
        report["hidden"] = f"{covered} path(s) covered by empty mounts"
    return shm, bool(plan.hidden) and covered == len(plan.hidden)


def apply(plan: Plan) -> dict[str, str]:
    """Isolate the calling process (a child before exec); return what was and was not applied."""
    policy, report = plan.policy, {}
    mounts = (
        bool(plan.readonly)
        or bool(plan.hidden)
        or (policy.private_shm and os.path.isdir("/dev/shm"))
    )
    flags = (0 if policy.network else CLONE_NEWNET) | (CLONE_NEWNS if mounts else 0)
    namespaces = ""
    if flags:
        try:
            namespaces = _unshare(flags)
        except OSError as exc:
            namespaces = ""
            report["namespaces"] = f"{NOT}available: {exc}"
    if policy.network:
        report["network"] = "allowed (policy.network=True)"
    elif namespaces:
        with contextlib.suppress(OSError):
            _loopback_up()
        report["network"] = f"isolated: {namespaces} with its own loopback only"
    if namespaces:  # a namespace no descendant can leave: how the parent finds them all
        report["ns"] = os.readlink(
            "/proc/self/ns/mnt" if flags & CLONE_NEWNS else "/proc/self/ns/net"
        )
    shm, hidden_by_mounts = (
        _mounts(plan, report) if flags & CLONE_NEWNS and namespaces else (False, False)
    )
    proc_guarded = bool(flags & CLONE_NEWNS and namespaces) and _guard_proc()
    if plan.readonly and "readonly" not in report:
        report["readonly"] = f"{NOT}enforced (no mount namespace); checked after the run"
    if policy.private_shm and not shm and os.path.isdir("/dev/shm"):
        report["shm"] = (
            "the host's /dev/shm (listed in Policy.writable)"
            if "/dev/shm" in policy.writable
            else f"{NOT}private (no mount namespace); list /dev/shm in Policy.writable for NCCL"
        )
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    tcp_by_landlock = not policy.network and not namespaces
    if plan.abi:
        try:
            # The command and its descendants may write their own /proc/<pid> entries: CUDA's
            # initialisation does (cuInit fails with error 304 otherwise; seen on an H200,
            # 2026-11-29). Other processes' entries stay refused: Landlock denies ptrace-mode
            # access outside the sandbox's domain, and /proc/sys needs dropped capabilities.
            # With /proc/sys read-only and sysrq-trigger covered, all of /proc may be written
            # (grandchildren included); without a mount namespace, only the command's own.
            own = ["/proc" if proc_guarded else "/proc/self", *(["/dev/shm"] if shm else [])]
            # Hidden paths covered by mounts need no Landlock read rules, which CUDA does not
            # survive (cuInit fails with error 304 under them; seen on an H200, 2026-11-29).
            restricted = _landlock(plan, tcp_by_landlock, own, restrict_reads=not hidden_by_mounts)
        except OSError as exc:
            restricted = f"{NOT}applied: {exc}"
    else:
        restricted = f"{NOT}available (kernel < 5.13, disabled, or refused by seccomp)"
    report["landlock"] = restricted
    landlocked = not restricted.startswith(NOT)
    if tcp_by_landlock and "network" not in report:
        report["network"] = (
            "TCP blocked by Landlock; UDP and unix sockets open"
            if landlocked and "tcp" in restricted
            else f"{NOT}isolated: no network namespace (run as root or enable user namespaces) nor Landlock >= 4"
        )
    if policy.confine_writes:
        report["writes"] = (
            f"confined to the workdir and {len(plan.write_rules) - 1} more path(s)"
            if landlocked and "writes" in restricted
            else f"{NOT}confined: Landlock unavailable"
        )
    if plan.read_rules is not None and "hidden" not in report:
        hidden = len(policy.hidden)
        report["hidden"] = (
            f"{hidden} path(s) unreadable"
            if "reads" in restricted
            else f"{NOT}hidden: Landlock unavailable"
        )
    report["capabilities"] = _drop_caps() if policy.drop_caps else "kept (policy.drop_caps=False)"
    return report


def _drop_caps() -> str:
    with contextlib.suppress(OSError):
        _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient")
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    if _libc.prctl(PR_CAPBSET_DROP, 0, 0, 0, 0) != 0:
        return (
            "none to drop (not root)"
            if os.geteuid() != 0
            else f"{NOT}dropped: {os.strerror(ctypes.get_errno())}"
        )
    for cap in range(1, last + 1):
        _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
    return "all dropped (empty bounding set)"


def snapshot(paths: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """(inode, size, mtime, ctime) of every file under ``paths``; ctime cannot be set back."""
    files = {}
    for root in map(Path, paths):
        for path in [p for p in root.rglob("*") if p.is_file()] if root.is_dir() else [root]:
            with contextlib.suppress(OSError):
                st = path.stat()
                files[str(path)] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return files


def changed(
    before: dict[str, tuple[int, ...]], after: dict[str, tuple[int, ...]]
) -> tuple[str, ...]:
    """Files of two snapshots that changed, appeared or vanished, sorted."""
    return tuple(sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p)))


def gaps(report: dict[str, str]) -> dict[str, str]:
    """The entries of an isolation report that name a protection not applied."""
    return {key: value for key, value in report.items() if value.startswith(NOT)}
