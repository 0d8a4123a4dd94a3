"""Linux isolation for sandboxed commands: namespaces, private layers, Landlock, no capabilities.

``plan()`` runs in the parent and resolves a ``Policy`` into paths and flags; ``apply()``
runs in the child between fork and exec and reports, key by key, what it really applied.
Each protection degrades on its own when the platform refuses it, and the report says so
(values starting with ``NOT``); ``Policy(strict=True)`` refuses to run instead. Landlock
lives in ``evolve.sandbox.landlock``, private layers and the seccomp filter (keyrings, page cache) in
``evolve.sandbox.channels``.

Facts used (Linux man pages):
- ``unshare(CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC)`` needs CAP_SYS_ADMIN; unprivileged
  users get it inside a new user namespace (``CLONE_NEWUSER``) mapping only their own ids.
- An IPC namespace has its own System V IPC objects and POSIX message queues
  (``ipc_namespaces(7)``); a network namespace has its own abstract unix socket names
  (``unix(7)``).
- A process whose capability bounding set is empty gains no capability at execve, even as root.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import glob
import os
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from evolve.sandbox import channels, landlock
from evolve.sandbox.channels import NOT
from evolve.sandbox.channels import check as _check
from evolve.sandbox.channels import libc as _libc

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
CLONE_NEWIPC = 0x08000000
SCRATCH = ("/tmp", "/var/tmp")  # shared scratch folders given a private layer
HOST_SOCKETS = ("/tmp/nvidia-mps",)  # CUDA MPS's pipes: always the host's, when present
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND = 2, 4, 8, 4096
MS_REC, MS_PRIVATE = 16384, 1 << 18
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
DEFAULT_DEVICES = (
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/nvidia*",
)


class IsolationError(RuntimeError):
    """A protection that ``Policy(strict=True)`` asked for could not be applied."""


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
        private_tmp: lay a private writable layer over ``/tmp`` and ``/var/tmp`` (overlayfs
            on a tmpfs of the command's own): the host's files there stay readable, what the
            command writes or binds there (files, unix sockets) vanishes with it. The working
            directory and ``writable`` paths beneath them are bound back, so writes reach them.
        private_ipc: an IPC namespace of its own: System V shared memory, semaphores and
            message queues and POSIX message queues die with the command.
        private_keyrings: refuse the kernel keyring calls (``add_key``, ``request_key``,
            ``keyctl``) by seccomp: the user keyring is shared by every process of a uid.
        shared_caches: harness-written cache folders (e.g. a warmed compile cache) the
            command reads through a private writable layer: its own writes land in the layer
            and vanish, so no candidate leaves anything there for the next one. Point the
            tool at the folder yourself (``TRITON_CACHE_DIR`` ...). Without a mount
            namespace the folder is only protected by Landlock (read-only).
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
    private_tmp: bool = True
    private_ipc: bool = True
    private_keyrings: bool = True
    shared_caches: Sequence[str | Path] = ()
    strict: bool = False

    def __post_init__(self) -> None:
        for name in (
            "writable",
            "readonly",
            "hidden",
            "devices",
            "shared_caches",
        ):  # hashable, picklable
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
    scratch: tuple[str, ...] = ()  # folders given a private writable layer (/tmp, /var/tmp)
    rebind: tuple[str, ...] = ()  # writable or named paths beneath them, bound back from the host
    caches: tuple[str, ...] = ()  # shared caches given a private writable layer
    uid: int | None = None  # the unprivileged uid (and gid) it runs as; None: the caller's
    identity: str = ""  # the report's ``uid`` entry when it runs as the caller's uid


def plan(
    policy: Policy,
    workdir: Path,
    named: Sequence[str] = (),
    uid: int | None = None,
    identity: str = "",
) -> Plan:
    """Resolve ``policy`` for a command running in ``workdir`` (runs in the parent).

    ``named``: strings the command is given (arguments, environment values); those that are
    existing paths under /tmp or /var/tmp are bound back from the host over the private
    layer, like the writable paths there: a harness's unix socket reached through overlayfs
    refuses connections, so a socket the harness names must be the host's own.
    ``uid``: the unprivileged uid it is to run as (``evolve.sandbox.identity``), else None and
    ``identity`` says why not.
    """
    writable = [str(workdir.resolve())] + [os.path.realpath(p) for p in policy.writable]
    devices = sorted({path for pattern in policy.devices for path in glob.glob(pattern)})
    rules = tuple((p, os.path.isdir(p)) for p in [*writable, *devices] if os.path.exists(p))
    hidden = [os.path.realpath(p) for p in policy.hidden]
    scratch = []
    for path in dict.fromkeys(os.path.realpath(p) for p in SCRATCH if os.path.isdir(p)):
        if policy.private_tmp and not any(channels.within(path, w) for w in writable):
            scratch.append(path)  # a writable path that holds the whole folder keeps the host's
    given = [*named, *HOST_SOCKETS]
    given = [os.path.realpath(p) for p in given if os.path.isabs(p) and os.path.exists(p)]
    rebind: list[str] = []
    for path in sorted({*writable, *given}, key=len):  # outermost first; inner ones ride along
        inside = any(channels.within(path, s) and path != s for s in scratch)
        if inside and not any(channels.within(path, r) for r in rebind):
            rebind.append(path)
    return Plan(
        policy=policy,
        write_rules=rules,
        read_rules=landlock.read_rules(hidden) if hidden else None,
        readonly=tuple(os.path.realpath(p) for p in policy.readonly if os.path.exists(p)),
        hidden=tuple(p for p in hidden if os.path.exists(p)),
        blank=channels.blank_file() if any(os.path.isfile(p) for p in hidden) else "",
        abi=landlock.abi(),
        scratch=tuple(scratch),
        rebind=tuple(p for p in rebind if os.path.exists(p)),
        caches=tuple(
            path
            for path in map(os.path.realpath, policy.shared_caches)
            if os.path.isdir(path) and path not in writable
        ),
        uid=uid,
        identity=identity,
    )


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


def _guard_proc(report: dict[str, str]) -> bool:
    """In the command's mount namespace: a /proc of its own, listing only the processes it may
    ptrace (its own: Landlock and its empty capability set refuse every other), and every entry
    that is not a process's read-only (kernel settings, IRQ affinities, PCI configuration).

    Root owns the entries of root's processes and the kernel's settings: without this, a
    command run as root could write another process's ``oom_score_adj`` or an IRQ's affinity,
    which outlive it (a channel to the next command, and a change to the host).
    """
    try:
        flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
        _check(_libc.mount(b"proc", b"/proc", b"proc", flags, b"hidepid=ptraceable"), "mount /proc")
        listed = "its own processes only"
    except OSError:  # a user namespace may not mount the host's pid namespace (or Linux < 5.8)
        listed = f"{NOT}private: other processes of this user listed, some entries (oom_score_adj) writable"
    refused = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() and not entry.is_symlink():
            try:
                channels.bind_readonly(entry.path)
            except OSError:  # a /proc that refuses some binds (a gVisor sandbox, say)
                refused.append(entry.name)
    if {"sys", "sysrq-trigger"} & set(refused):  # the kernel's settings stay writable
        return False
    entries = f"{NOT}read-only: {', '.join(refused)}" if refused else "every other entry read-only"
    gap_first = entries.startswith(NOT) and not listed.startswith(NOT)  # "NOT" leads a gap's value
    report["proc"] = f"{entries}; {listed}" if gap_first else f"{listed}; {entries}"
    return True


def _mounts(plan: Plan, report: dict[str, str]) -> tuple[bool, bool, list[str]]:
    """In a new mount namespace: private /dev/shm, /tmp and caches, read-only binds, hidden paths.

    Returns (shm is private, every hidden path is covered, the folders given a private layer).
    """
    shm = False
    with contextlib.suppress(OSError):
        _check(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
        refused = channels.no_atime()
        report["atime"] = (
            f"{NOT}kept on {refused} mount(s): a read there can update a file's access time"
            if refused
            else "left as they were by reads (every mount noatime)"
        )
        if plan.policy.private_shm and os.path.isdir("/dev/shm"):
            flags = MS_NOSUID | MS_NODEV
            _check(
                _libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", flags, b"mode=1777"), "mount /dev/shm"
            )
            report["shm"], shm = "private tmpfs on /dev/shm", True
    layered = channels.lay(plan.scratch, plan.rebind, plan.caches, report, plan.uid)
    done = []
    with contextlib.suppress(OSError):
        for path in plan.readonly:
            channels.bind_readonly(path)
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
            channels.hide(path, plan.blank)
            covered += 1
    if plan.hidden and covered == len(plan.hidden):
        report["hidden"] = f"{covered} path(s) covered by empty mounts"
    # The working directory was entered before these mounts; enter it again through them, or
    # relative paths would bypass the read-only binds and ``..`` would reach the host's /tmp.
    os.chdir(os.getcwd())
    return shm, bool(plan.hidden) and covered == len(plan.hidden), layered


def apply(plan: Plan) -> dict[str, str]:
    """Isolate the calling process (a child before exec); return what was and was not applied."""
    policy, report = plan.policy, {}
    mounts = any((plan.readonly, plan.hidden, plan.scratch, plan.caches)) or (
        policy.private_shm and os.path.isdir("/dev/shm")
    )
    flags = (0 if policy.network else CLONE_NEWNET) | (CLONE_NEWNS if mounts else 0)
    flags |= CLONE_NEWIPC if policy.private_ipc else 0
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
    report["ipc"] = (
        "own IPC namespace: System V shared memory, semaphores, message queues and POSIX queues"
        if namespaces and flags & CLONE_NEWIPC
        else "the host's (policy.private_ipc=False)"
        if not policy.private_ipc
        else f"{NOT}private (no IPC namespace)"
    )
    shm, hidden_by_mounts, layered = (
        _mounts(plan, report) if flags & CLONE_NEWNS and namespaces else (False, False, [])
    )
    if "atime" not in report:
        report["atime"] = f"{NOT}kept (no mount namespace): a read can update a file's access time"
    if plan.scratch and "tmp" not in report:
        report["tmp"] = (
            f"{NOT}private (no mount namespace); writes there refused by Landlock if any"
        )
    elif not plan.scratch:
        report["tmp"] = (
            "the host's (policy.private_tmp=False)"
            if not policy.private_tmp
            else "the host's (listed in Policy.writable)"
        )
    if plan.caches and "shared_caches" not in report:
        report["shared_caches"] = (
            f"{NOT}layered (no mount namespace); writes refused by Landlock if any"
        )
    proc_guarded = bool(flags & CLONE_NEWNS and namespaces) and _guard_proc(report)
    if plan.readonly and "readonly" not in report:
        report["readonly"] = f"{NOT}enforced (no mount namespace); checked after the run"
    if policy.private_shm and not shm and os.path.isdir("/dev/shm"):
        report["shm"] = (
            "the host's /dev/shm (listed in Policy.writable)"
            if "/dev/shm" in policy.writable
            else f"{NOT}private (no mount namespace); list /dev/shm in Policy.writable for NCCL"
        )
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    try:
        report.update(channels.refuse_calls(keyrings=policy.private_keyrings))
    except OSError as exc:
        report["page_cache"] = f"{NOT}guarded: {exc}"
        report["keyrings"] = (
            f"{NOT}refused: {exc}"
            if policy.private_keyrings
            else "reachable (policy.private_keyrings=False)"
        )
    tcp_by_landlock = not policy.network and not namespaces
    if plan.abi:
        try:
            # The command and its descendants may write their own /proc/<pid> entries: CUDA's
            # initialisation does (cuInit fails with error 304 otherwise; seen on an H200,
            # 2026-11-29). With /proc guarded (``_guard_proc``: other processes unlisted where
            # it could mount its own, every other entry read-only), all of /proc may be written
            # (grandchildren included); without a mount namespace, only the command's own.
            own = ["/proc" if proc_guarded else "/proc/self", *(["/dev/shm"] if shm else [])]
            # Shared caches behind private layers stay writable (compilers write their caches);
            # /tmp and /var/tmp stay unwritable as before: their layer guards hosts without Landlock.
            own += [path for path in layered if path in plan.caches]
            # Hidden paths covered by mounts need no Landlock read rules, which CUDA does not
            # survive (cuInit fails with error 304 under them; seen on an H200, 2026-11-29).
            writes = [*plan.write_rules, *((p, True) for p in own)]
            restricted = landlock.restrict(
                plan.abi,
                writes if policy.confine_writes else None,
                None if hidden_by_mounts else plan.read_rules,
                tcp=tcp_by_landlock,
            )
        except OSError as exc:
            restricted = f"{NOT}applied: {exc}"
    else:
        restricted = f"{NOT}available (kernel < 5.13, disabled, or refused by seccomp)"
    report["landlock"] = restricted
    landlocked = not restricted.startswith(NOT)
    if "proc" not in report:
        report["proc"] = (
            "only its own entries writable (Landlock)"
            if landlocked and "writes" in restricted
            else f"{NOT}guarded: other processes' entries and kernel settings writable where "
            "permissions allow"
        )
    if tcp_by_landlock and "network" not in report:
        report["network"] = (
            "TCP blocked by Landlock; UDP and unix sockets open"
            if landlocked and "tcp" in restricted
            else f"{NOT}isolated: no network namespace (run as root or enable user namespaces) nor Landlock >= 4"
        )
    isolated_net = bool(namespaces) and not policy.network
    scopes = ["own network namespace"] if isolated_net else []
    scopes += ["Landlock scope"] if "abstract sockets" in restricted else []
    report["abstract_sockets"] = (
        f"scoped to the command: {' and '.join(scopes)}" if scopes else f"{NOT}scoped"
    )
    report["unix_sockets"] = (
        "made under /tmp or /var/tmp: private; elsewhere only in writable paths; sockets "
        "outside them (e.g. /run) stay reachable where file permissions allow"
        if plan.scratch and not report["tmp"].startswith(NOT)
        else "made only in writable paths (Landlock); sockets outside them stay reachable "
        "where file permissions allow"
        if landlocked and "writes" in restricted
        else f"{NOT}confined: Landlock unavailable"
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
    report["uid"] = _become(plan.uid) if plan.uid is not None else plan.identity
    return report


def _become(uid: int) -> str:
    """Run as ``uid`` and its own gid, without supplementary groups (after everything that needs root)."""
    try:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    except OSError as exc:
        return f"{NOT}changed: {exc}; it runs as uid {os.getuid()}, the owner of that uid's files"
    return f"an unprivileged uid of its evaluation's, owner of no host file ({uid})"


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
