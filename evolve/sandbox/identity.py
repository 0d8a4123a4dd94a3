"""The unprivileged uid sandboxed commands run as: one per evaluation, given what it must reach.

Run as root, evolve starts every sandboxed command as a uid (and gid) of its own, that no
account uses and that owns no host file: a command running as root would own every host
file, and could change their modes, times and extended attributes (Landlock confines writes
of contents, not those), page out their cached pages (``madvise(MADV_PAGEOUT)`` is allowed
to a file's owner) and share RLIMIT_NPROC's count with every other root process.

Every sandboxed command of one evaluation shares its uid (``fresh``, around each job), so
that what one of them writes (a checkpoint) the next may read and replace, in any mode;
commands of other evaluations run as other uids. The sandbox gives the uid its working
directory and ``Policy.writable`` folders (``grant``: their owner becomes the uid) and a way
to every path it is given (in its arguments, environment, policy or job on stdin) or hidden
from: a folder of the caller's on the way that others may not list (``/root`` holding a pyenv interpreter, a ``mkdtemp`` scratch folder) gets read and
search permission for others (``o+rx``: its names become listable, files keep their modes;
a harness process hiding a path from its child lists every folder on the way,
``evolve.sandbox.landlock.read_rules``). A command running as root could read all of them.

A ``Policy.writable`` folder that evaluations running at the same time share belongs to the
one that started last: give such a folder mode 1777 (as ``/dev/shm`` has), which ``grant``
leaves alone.

The uid travels in an environment variable, like ``evolve.sandbox.unreadable``'s paths, so that
worker processes inherit it; the sandbox never passes the variable on to the command.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import stat
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

log = logging.getLogger(__name__)
VAR = "EVOLVE_SANDBOX_UID"
FIRST, COUNT = 0x40000000, 0x3FFF0000  # far above the uids and subuid ranges accounts use
CAPABILITIES = {0: "CAP_CHOWN", 1: "CAP_DAC_OVERRIDE", 2: "CAP_DAC_READ_SEARCH", 3: "CAP_FOWNER"}
CAPABILITIES |= {6: "CAP_SETGID", 7: "CAP_SETUID"}


def _pick() -> int:
    return FIRST + secrets.randbelow(COUNT)


def current() -> int:
    """The uid for commands sandboxed now: the evaluation's (``fresh``), else this process's own."""
    if not os.environ.get(VAR, "").isdigit():
        os.environ[VAR] = str(_pick())
    return int(os.environ[VAR])


@contextlib.contextmanager
def fresh() -> Iterator[int]:
    """Within the block, the commands sandboxed by this process (and the workers it starts) run
    as a new uid; yields it."""
    before = os.environ.get(VAR)
    os.environ[VAR] = str(_pick())
    try:
        yield int(os.environ[VAR])
    finally:
        if before is None:
            del os.environ[VAR]
        else:
            os.environ[VAR] = before


def sandboxed(uid: int) -> bool:
    """True when ``uid`` is one this module hands out (the caller itself runs sandboxed)."""
    return FIRST <= uid < FIRST + COUNT


def usable(uid: int) -> str:
    """Empty when this process may switch a child to ``uid``, else why not (a report's words).

    Besides switching (CAP_SETUID, CAP_SETGID) and granting (CAP_CHOWN), the caller must read
    and remove whatever the uid leaves, in any mode (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH,
    CAP_FOWNER).
    """
    if os.geteuid() != 0:
        return f"the caller runs as uid {os.geteuid()}, not root"
    status = Path("/proc/self/status").read_text()
    effective = int(status.split("CapEff:")[1].split()[0], 16)
    missing = [name for bit, name in CAPABILITIES.items() if not effective >> bit & 1]
    if missing:
        return f"the caller lacks {', '.join(missing)}"
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/uid_map").read_text().splitlines():
            inside, _, count = map(int, line.split())
            if inside <= uid < inside + count:
                return ""
    return f"uid {uid} is not mapped in this user namespace (/proc/self/uid_map)"


def grant(uid: int, owned: Sequence[str], reached: Sequence[str], kept: Sequence[str] = ()) -> None:
    """Make ``uid`` the owner of the folders in ``owned`` and all beneath them but ``kept``, and
    let it reach every path in ``reached`` and in this Python installation (see the module's
    docstring).

    Beneath an owned folder, only entries of the caller's that have one link change owner (a
    hard link could be a host file's), without following links or leaving the file system;
    folders anyone may write (``/dev/shm``) keep theirs.
    """
    me = os.geteuid()
    for root in owned:
        top = os.lstat(root)
        if stat.S_ISREG(top.st_mode) and top.st_uid == me and top.st_nlink == 1:
            os.chown(root, uid, uid, follow_symlinks=False)
        if not stat.S_ISDIR(top.st_mode) or top.st_mode & stat.S_IWOTH:
            continue
        for folder, subfolders, files, fd in os.fwalk(root):
            if os.fstat(fd).st_dev != top.st_dev:
                subfolders.clear()
                continue
            subfolders[:] = [d for d in subfolders if os.path.join(folder, d) not in kept]
            files = [f for f in files if os.path.join(folder, f) not in kept]
            with contextlib.suppress(OSError):
                os.chown(fd, uid, uid)
            for name in files:
                with contextlib.suppress(OSError):
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if st.st_uid == me and st.st_nlink == 1 and not stat.S_ISLNK(st.st_mode):
                        os.chown(name, uid, uid, dir_fd=fd, follow_symlinks=False)
    python = [sys.executable, sys.prefix, sys.base_prefix, *sys.path]
    for path in {*reached, *(p for p in python if os.path.isabs(p))}:
        reach(path)
    for path in reached:  # a harness's unix socket: connecting needs write permission
        with contextlib.suppress(OSError):
            st = os.stat(path, follow_symlinks=False)
            if stat.S_ISSOCK(st.st_mode) and st.st_uid == me:
                os.chown(path, uid, uid, follow_symlinks=False)


def paths_in(data: bytes, limit: int = 1 << 20) -> list[str]:
    """The existing absolute paths quoted in the first ``limit`` bytes of ``data`` (a job on a
    command's stdin: JSON strings)."""
    text = data[:limit].decode(errors="replace")
    return [p for p in dict.fromkeys(re.findall(r'"(/[^"\\]+)"', text)) if os.path.exists(p)]


def reach(path: str | os.PathLike[str]) -> None:
    """Let others list and search each folder of the caller's on the way to ``path`` (and
    ``path``, a folder): the sandbox does so for every path its command is given in its
    arguments, environment or job (``paths_in``); call it for one given any other way."""
    me, path = os.geteuid(), os.path.realpath(path)
    if me != 0:  # only root runs commands as another uid
        return
    parent = path if os.path.isdir(path) else os.path.dirname(path)
    wanted = stat.S_IROTH | stat.S_IXOTH
    while True:  # checked each time: another process may take the permission away again
        with contextlib.suppress(OSError):
            st = os.stat(parent)
            if st.st_uid == me and st.st_mode & wanted != wanted:
                os.chmod(parent, stat.S_IMODE(st.st_mode) | wanted)
                log.warning("sandbox: %s made listable by others (o+rx) for sandboxed uids", parent)
        if parent == "/":
            break
        parent = os.path.dirname(parent)
