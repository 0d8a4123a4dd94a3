"""Close the channels one evaluation could leave for the next: private layers, keyrings refused.

Runs in the sandboxed child between fork and exec, inside the mount namespace that
``evolve.sandbox.isolation`` created. Facts used (Linux man pages and the kernel's documentation):
- overlayfs (``Documentation/filesystems/overlayfs.rst``) merges a read-only lower folder
  with a writable upper one; every write lands in the upper folder. With the upper folder
  on a tmpfs of the command's own, nothing it writes there outlives its mount namespace.
  Unprivileged mounts of overlayfs inside a user namespace need Linux >= 5.11.
- ``mount(2)`` accepts ``/proc/self/fd/N`` as a path, so a folder opened before it was
  covered can still be bound or layered afterwards.
- Kernel keyrings (``keyrings(7)``): the user keyring is shared by every process of a uid
  (per user namespace), and a session keyring is inherited across fork and exec; seccomp
  (``seccomp(2)``) can refuse the three system calls that reach them.
- The page cache is the host's: which pages of a readable file it holds can be read
  (``mincore(2)``, ``cachestat(2)``, ``preadv2(2)`` with ``RWF_NOWAIT``, which fails rather
  than wait for the disk) and steered (``posix_fadvise(2)``, ``readahead(2)``, ``madvise(2)``
  with ``MADV_WILLNEED``/``COLD``/``PAGEOUT``/``POPULATE_READ``, ``process_madvise(2)``);
  Linux AIO (``io_submit(2)``) and io_uring take ``RWF_NOWAIT`` and advice in memory that
  seccomp cannot read, so their setup calls are refused whole. A classic BPF filter sees the
  call's number and its arguments (``struct seccomp_data``: nr at byte 0, arch at 4, the
  arguments from byte 16, 8 bytes each, low half first on little-endian machines).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import platform
import re
import stat
import struct
import tempfile
from collections.abc import Sequence

libc = ctypes.CDLL(None, use_errno=True)

NOT = "NOT "  # report values that start with this name a protection that was not applied
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_NOATIME = 1, 2, 4, 8, 32, 1024
MS_BIND = 4096
MS_REC, MNT_DETACH = 16384, 2
_KEEP_MOUNT_FLAGS = {2: 2, 4: 4, 8: 8, 1024: 1024, 2048: 2048, 4096: 1 << 21}  # ST_* -> MS_*
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
RET_ALLOW, RET_ERRNO, EPERM = 0x7FFF0000, 0x00050000, 1
LD_ABS_W, RET_K, JA, JEQ_K, JGE_K, JSET_K = 0x20, 0x06, 0x05, 0x15, 0x35, 0x45  # BPF
X32_BIT = 0x40000000
# machine -> (AUDIT_ARCH_*, numbers of add_key, request_key, keyctl) from the kernel's tables
KEY_SYSCALLS = {
    "x86_64": (0xC000003E, (248, 249, 250)),
    "aarch64": (0xC00000B7, (217, 218, 219)),
}
# machine -> numbers of mincore, fadvise64, readahead, remap_file_pages, io_setup (Linux AIO),
# io_uring_setup, process_madvise, cachestat: refused whatever their arguments
PAGE_CACHE_SYSCALLS = {
    "x86_64": (27, 221, 187, 216, 206, 425, 440, 451),
    "aarch64": (232, 223, 213, 234, 0, 425, 440, 451),
}
RWF_NOWAIT = 0x8
MADV_REFUSED = (3, 20, 21, 22)  # MADV_WILLNEED, MADV_COLD, MADV_PAGEOUT, MADV_POPULATE_READ
# machine -> (number, argument, refused flag bits | refused values): preadv2 and pwritev2 with
# RWF_NOWAIT in their flags (the sixth argument), madvise with a refused advice (the third)
PAGE_CACHE_ARGUMENTS: dict[str, tuple[tuple[int, int, int | tuple[int, ...]], ...]] = {
    "x86_64": ((327, 5, RWF_NOWAIT), (328, 5, RWF_NOWAIT), (28, 2, MADV_REFUSED)),
    "aarch64": ((286, 5, RWF_NOWAIT), (287, 5, RWF_NOWAIT), (233, 2, MADV_REFUSED)),
}
KEYCTL_JOIN_SESSION_KEYRING, SYS_KEYCTL = 1, {"x86_64": 250, "aarch64": 219}


def check(result: int, what: str) -> None:
    """Raise ``OSError`` naming ``what`` when a libc call returned non-zero."""
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None
) -> None:
    encoded = [s.encode() if s is not None else None for s in (source, target, fstype, data)]
    check(libc.mount(encoded[0], encoded[1], encoded[2], flags, encoded[3]), f"mount {target}")


def open_paths(paths: Sequence[str]) -> dict[str, int]:
    """O_PATH handles on ``paths`` (those that exist), to reach them once they are covered."""
    handles = {}
    for path in paths:
        try:
            handles[path] = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
    return handles


def private_layer(target: str, lower: int, owner: int | None = None) -> None:
    """Lay a private writable layer over ``target``; ``lower`` is a handle on what it shows beneath.

    A tmpfs is mounted on ``target`` first to hold the layer's upper and work folders; the
    overlay then covers that tmpfs, so the command sees the merged view and nothing else.
    Its top folder keeps the mode and owner of ``lower``'s, or belongs to ``owner`` (with every
    folder beneath it: the uid the command will run as may then write anywhere in the layer).
    """
    _mount("tmpfs", target, "tmpfs", 0, "mode=0755")
    try:
        upper, below = os.path.join(target, "upper"), os.fstat(lower)
        os.mkdir(upper)
        os.chmod(upper, stat.S_IMODE(below.st_mode))  # the merged view's top folder shows these
        os.chown(
            upper,
            below.st_uid if owner is None else owner,
            below.st_gid if owner is None else owner,
        )
        os.mkdir(os.path.join(target, "work"), 0o700)
        stage = os.open(target, os.O_PATH | os.O_CLOEXEC)
        try:
            options = (
                f"lowerdir=/proc/self/fd/{lower},upperdir=/proc/self/fd/{stage}/upper,"
                f"workdir=/proc/self/fd/{stage}/work"
            )
            try:
                _mount("overlay", target, "overlay", 0, options)
            except OSError:  # inside a user namespace the layer's metadata needs user xattrs
                _mount("overlay", target, "overlay", 0, options + ",userxattr")
        finally:
            os.close(stage)
        if owner is not None:  # each folder is copied up into the layer, with its new owner
            try:
                for folder, _, _, fd in os.fwalk(target):
                    if folder != target:
                        os.chown(fd, owner, owner)
            except OSError:
                libc.umount2(target.encode(), MNT_DETACH)  # the overlay; the tmpfs goes below
                raise
    except OSError:
        libc.umount2(target.encode(), MNT_DETACH)  # show the host's folder again
        raise


def drop_layer(target: str) -> None:
    """Take a private layer (and whatever was bound into it) off ``target`` again."""
    for _ in range(2):  # the overlay, then the tmpfs beneath it
        libc.umount2(target.encode(), MNT_DETACH)


def rebind(target: str, handle: int) -> None:
    """Bind the folder behind ``handle`` (opened before ``target`` was covered) back onto ``target``."""
    _mount(f"/proc/self/fd/{handle}", target, None, MS_BIND | MS_REC, None)


def bind_readonly(path: str) -> None:
    """Bind ``path`` onto itself read-only, keeping its other mount flags."""
    keep = sum(ms for st, ms in _KEEP_MOUNT_FLAGS.items() if os.statvfs(path).f_flag & st)
    check(libc.mount(path.encode(), path.encode(), None, MS_BIND | MS_REC, None), f"bind {path}")
    flags = MS_BIND | MS_REMOUNT | MS_RDONLY | keep
    check(libc.mount(None, path.encode(), None, flags, None), f"remount {path} read-only")


def no_atime() -> int:
    """Remount every mount of this (new) namespace ``noatime``; return how many refused.

    A read updates a file's access time (relatime: when it is older than the file's last
    change, or a day old), which the next command can see: a bit for every file nothing else
    reads. Mounts made later from these (binds, private layers) inherit the flag.
    """
    with open("/proc/self/mountinfo") as handle:
        points = dict.fromkeys(line.split()[4] for line in handle)
    refused = 0
    for point in points:
        path = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), point)  # \040: a space
        try:
            keep = os.statvfs(path).f_flag & (MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
            _mount(None, path, None, MS_BIND | MS_REMOUNT | keep | MS_NOATIME, None)
        except OSError:
            refused += 1
    return refused


def lay(
    scratch: Sequence[str],
    rebinds: Sequence[str],
    caches: Sequence[str],
    report: dict[str, str],
    owner: int | None = None,
) -> list[str]:
    """Private writable layers over ``scratch`` folders and shared ``caches``; the folders layered.

    ``rebinds`` (paths beneath a scratch folder) are bound back from the host over the layer.
    The caches' layers belong to ``owner`` (the uid the command will run as), when given.
    Reports under ``tmp`` and ``shared_caches``.
    """
    handles = open_paths([*scratch, *rebinds, *caches])
    layered, problems = [], []
    try:
        for path in scratch:
            try:
                private_layer(path, handles[path])
                for inner in [p for p in rebinds if within(p, path)]:
                    try:
                        rebind(inner, handles[inner])
                    except (OSError, KeyError):
                        drop_layer(path)  # the command's writes must reach ``inner``
                        raise
                layered.append(path)
            except (OSError, KeyError) as exc:
                problems.append(f"{path}: {exc}")
        if scratch:
            report["tmp"] = (
                f"{NOT}private: {'; '.join(problems)}"
                if problems
                else f"private writable layer over {', '.join(layered)} (the host's files readable beneath)"
            )
        kinds = []
        for path in caches:
            try:
                private_layer(path, handles[path], owner)
                layered.append(path)
                kinds.append("a private writable layer")
            except (OSError, KeyError):
                with contextlib.suppress(OSError):
                    bind_readonly(path)
                    kinds.append("read-only")
        if caches:
            report["shared_caches"] = (
                f"{len(caches)} shared cache(s) behind {', '.join(sorted(set(kinds)))}"
                if len(kinds) == len(caches)
                else f"{NOT}protected: {len(caches) - len(kinds)} shared cache(s) not layered"
            )
    finally:
        for handle in handles.values():
            os.close(handle)
    return layered


def hide(path: str, blank: str) -> None:
    """Cover ``path``: an empty read-only tmpfs over a folder, the unreadable ``blank`` over a file."""
    if os.path.isdir(path):
        flags = MS_RDONLY | MS_NOSUID | MS_NODEV
        check(libc.mount(b"tmpfs", path.encode(), b"tmpfs", flags, b"mode=000"), f"hide {path}")
    else:
        check(libc.mount(blank.encode(), path.encode(), None, MS_BIND, None), f"hide {path}")


@functools.cache
def blank_file() -> str:
    """An empty file nobody may read (mode 000), bound over hidden files."""
    handle, path = tempfile.mkstemp(prefix="evolve-hidden-")
    os.close(handle)
    os.chmod(path, 0)
    return path


def within(path: str, root: str) -> bool:
    """True when ``path`` is ``root`` or lies beneath it."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def filter_prologue(machine: str) -> list[tuple[int, int, int, int]]:
    """A seccomp program's start: calls of another ABI refused, then the call's number loaded.

    ``machine`` must be a key of ``KEY_SYSCALLS`` (whose first item is the audit arch)."""
    deny = RET_ERRNO | EPERM
    arch = KEY_SYSCALLS[machine][0]
    program = [(LD_ABS_W, 0, 0, 4), (JEQ_K, 1, 0, arch), (RET_K, 0, 0, deny), (LD_ABS_W, 0, 0, 0)]
    if machine == "x86_64":  # the x32 ABI reaches the same calls with this bit set
        program += [(JGE_K, 0, 1, X32_BIT), (RET_K, 0, 0, deny)]
    return program


def install_filter(program: list[tuple[int, int, int, int]]) -> None:
    """Install ``program`` (then allow every other call) as a seccomp filter of this process.

    Needs no-new-privileges set first; filters stack, and the strictest answer wins."""
    program = [*program, (RET_K, 0, 0, RET_ALLOW)]
    code = b"".join(struct.pack("HBBI", *op) for op in program)
    filters = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("@HP", len(program), ctypes.addressof(filters))
    buffer = ctypes.create_string_buffer(fprog, len(fprog))
    check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, buffer, 0, 0), "seccomp filter")


def refuse_calls(*, keyrings: bool) -> dict[str, str]:
    """Install the seccomp filter: every non-native ABI refused, and the calls that read or
    steer the page cache (``PAGE_CACHE_SYSCALLS``, ``PAGE_CACHE_ARGUMENTS``), and with
    ``keyrings`` add_key, request_key and keyctl; return the ``page_cache`` and ``keyrings``
    report entries.

    Where this machine's system call numbers are not known, nothing is filtered: the keyrings
    fall back to a fresh session keyring of the command's own (the user keyring stays shared).
    Needs no-new-privileges set first.
    """
    machine = platform.machine()
    if machine not in KEY_SYSCALLS:
        keyctl = SYS_KEYCTL.get(machine)
        joined = keyctl is not None and libc.syscall(keyctl, KEYCTL_JOIN_SESSION_KEYRING, None) >= 0
        where = "a session keyring of its own" if joined else "the inherited session keyring"
        return {
            "page_cache": f"{NOT}guarded on {machine}: residency readable and steerable",
            "keyrings": f"{NOT}refused on {machine}: {where}; the user keyring is shared"
            if keyrings
            else "reachable (policy.private_keyrings=False)",
        }
    numbers = KEY_SYSCALLS[machine][1]
    deny = RET_ERRNO | EPERM
    program = filter_prologue(machine)
    for number in (*PAGE_CACHE_SYSCALLS[machine], *(numbers if keyrings else ())):
        program += [(JEQ_K, 0, 1, number), (RET_K, 0, 0, deny)]
    for number, argument, refused in PAGE_CACHE_ARGUMENTS[machine]:
        tests = [(JSET_K, refused)] if isinstance(refused, int) else [(JEQ_K, v) for v in refused]
        # another call: on to the reload; a test that matches: to the denial; none: past it
        program += [(JEQ_K, 0, len(tests) + 3, number), (LD_ABS_W, 0, 0, 16 + 8 * argument)]
        program += [(op, len(tests) - i, 0, k) for i, (op, k) in enumerate(tests)]
        program += [(JA, 0, 0, 1), (RET_K, 0, 0, deny), (LD_ABS_W, 0, 0, 0)]
    install_filter(program)
    return {
        "page_cache": "residency unreadable and unsteerable: mincore, cachestat, fadvise, "
        "readahead, RWF_NOWAIT reads and writes, madvise WILLNEED/COLD/PAGEOUT/POPULATE_READ, "
        "process_madvise, AIO and io_uring refused (seccomp); pages it reads stay cached",
        "keyrings": "unreachable: add_key, request_key and keyctl refused (seccomp)"
        if keyrings
        else "reachable (policy.private_keyrings=False)",
    }
