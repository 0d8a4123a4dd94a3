"""The CPU cores a sandboxed command may use: disjoint per slot, held by the kernel, never widened.

``split`` gives a backend's slots disjoint cores. ``plan`` (in the parent) picks a command's
cores from the caller's CPU affinity (a slot worker's: its slot's cores) and prepares a
cpuset cgroup for them; ``confine`` (in the child, before isolation) moves the command into
that cgroup and sets its affinity. Without a cgroup the affinity is set and, where it is
narrower than the machine, seccomp makes ``sched_setaffinity`` a no-op so that it stays so.

Facts used (Linux man pages and the kernel's ``Documentation/admin-guide/cgroup-v1/cpusets.rst``
and ``cgroup-v2.rst``):
- a task's affinity is always within its cpuset: ``sched_setaffinity`` cannot widen it past the
  cpuset's cores (the kernel clips the mask), and threads and children inherit both;
- writing ``0`` to a cgroup's ``cgroup.procs`` moves the writing process (all its threads);
  leaving the cgroup needs a write to another cgroup's ``cgroup.procs``, which Landlock's
  confinement of writes refuses, or in v2 ``clone3(CLONE_INTO_CGROUP)``, which only the
  files' permissions refuse: a command running as root could leave by one or the other
  (``held`` says so), one running as another uid cannot;
- a v1 cpuset starts with no cores and no memory nodes: both are set before any task joins;
  a v2 cgroup needs ``+cpuset`` in its parent's ``cgroup.subtree_control``;
- OpenMP, MKL, OpenBLAS and torch's compile workers size their thread pools from the
  variables ``hints`` sets.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from evolve.sandbox.channels import (
    JEQ_K,
    NOT,
    RET_ERRNO,
    RET_K,
    check,
    filter_prologue,
    install_filter,
    libc,
)

log = logging.getLogger(__name__)
CGROUP_MOUNTS = ("/sys/fs/cgroup/cpuset", "/sys/fs/cgroup")  # v1's cpuset hierarchy, then v2's
SCHED_SETAFFINITY = {"x86_64": 203, "aarch64": 122}
PR_SET_NO_NEW_PRIVS = 38
MATH_THREADS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
COMPILE_THREADS = "TORCHINDUCTOR_COMPILE_THREADS"


@dataclass(frozen=True)
class Allowance:
    """The cores one command gets, resolved in the parent for ``confine`` in the child.

    Attributes:
        cores: the cores the command may run on.
        asked: the number of cores asked for (None: all the caller's).
        online: every core of the machine.
        cgroup: the cpuset cgroup holding ``cores`` (a folder), or None.
        why_not: why there is no cgroup, when there is none.
    """

    cores: tuple[int, ...]
    asked: int | None
    online: tuple[int, ...]
    cgroup: str | None
    why_not: str = ""

    @property
    def narrower(self) -> bool:
        """True when the command gets fewer cores than the machine has (so widening would pay)."""
        return set(self.online) - set(self.cores) != set()


def split(slots: int, cores: Sequence[int] | None = None) -> list[tuple[int, ...]]:
    """Disjoint cores for each of ``slots`` slots, from ``cores`` (default: this process's affinity).

    The cores are dealt out in contiguous runs, as evenly as they go (the first slots take
    the remainder). With more slots than cores, slot ``i`` gets core ``i mod n``: slots then
    share cores, and the kernel divides a shared core between their threads (a warning says so).
    """
    pool = sorted(os.sched_getaffinity(0) if cores is None else cores)
    if slots < 1 or not pool:
        raise ValueError(f"{slots} slot(s) on cores {pool}: need at least one of each")
    if slots > len(pool):
        log.warning(
            "%d evaluation slots on %d CPU cores: slots share cores, so evaluations side by "
            "side slow each other; set search.workers to at most %d",
            slots,
            len(pool),
            len(pool),
        )
        return [(pool[i % len(pool)],) for i in range(slots)]
    base, extra = divmod(len(pool), slots)
    runs, start = [], 0
    for slot in range(slots):
        size = base + (slot < extra)
        runs.append(tuple(pool[start : start + size]))
        start += size
    return runs


@contextlib.contextmanager
def inherited(cores: Sequence[int]) -> Iterator[None]:
    """Within the block, the calling thread runs on ``cores``: a process it starts inherits them
    from its first instruction, and every thread and child of that process after it."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def online() -> tuple[int, ...]:
    """Every online core of this machine (``/sys/devices/system/cpu/online``)."""
    try:
        text = Path("/sys/devices/system/cpu/online").read_text().strip()
    except OSError:
        return tuple(range(os.cpu_count() or 1))
    return parse_list(text)


def parse_list(text: str) -> tuple[int, ...]:
    """Cores from the kernel's list format (``0-3,8,10-11``)."""
    found: list[int] = []
    for part in filter(None, text.strip().split(",")):
        low, _, high = part.partition("-")
        found.extend(range(int(low), int(high or low) + 1))
    return tuple(found)


def format_list(cores: Sequence[int]) -> str:
    """Cores in the kernel's list format, runs joined by dashes (``0-3,8``)."""
    parts, ordered = [], sorted(cores)
    start = prev = ordered[0]
    for core in [*ordered[1:], None]:
        if core is not None and core == prev + 1:
            prev = core
            continue
        parts.append(f"{start}-{prev}" if prev != start else str(start))
        if core is not None:
            start = prev = core
    return ",".join(parts)


def plan(count: int | None = None) -> Allowance:
    """The first ``count`` cores of this process's affinity (None: all), with a cgroup if possible.

    Runs in the parent: the cgroup is made (or found) here, where failures can be reported.
    """
    mine = tuple(sorted(os.sched_getaffinity(0)))
    if count is not None and count < 1:
        raise ValueError(f"Limits.cores={count}: give at least 1 core, or None for all")
    cores = mine[:count] if count else mine
    try:
        cgroup, why_not = _cgroup(cores), ""
    except OSError as exc:
        cgroup, why_not = None, f"{exc.strerror or exc} ({exc.filename or 'cgroup'})"
    return Allowance(cores=cores, asked=count, online=online(), cgroup=cgroup, why_not=why_not)


def _cgroup(cores: tuple[int, ...]) -> str:
    """The cpuset cgroup for ``cores`` beside the caller's own (made when missing); OSError if none."""
    for mount in CGROUP_MOUNTS:
        v1 = mount.endswith("cpuset")
        if v1 and not Path(mount, "cpuset.cpus").exists():
            continue
        if not v1 and "cpuset" not in _read(Path(mount, "cgroup.controllers")).split():
            continue
        parent = Path(mount) if not v1 else Path(mount) / _own_path("cpuset")
        if not v1 and "cpuset" not in _read(parent / "cgroup.subtree_control").split():
            _write(parent / "cgroup.subtree_control", "+cpuset")
        folder = parent / f"evolve-cpus-{format_list(cores).replace(',', '_')}"
        wanted = format_list(cores)
        if folder.is_dir() and parse_list(_read(folder / "cpuset.cpus")) == cores:
            return str(folder)
        folder.mkdir(exist_ok=True)
        _write(folder / "cpuset.cpus", wanted)
        if v1 or not _read(folder / "cpuset.mems").strip():
            mems = _read(parent / "cpuset.mems") or _read(parent / "cpuset.mems.effective")
            _write(folder / "cpuset.mems", mems.strip() or "0")
        return str(folder)
    raise OSError(0, "no cpuset controller mounted", "/sys/fs/cgroup")


def _own_path(controller: str) -> str:
    """This process's cgroup in the v1 hierarchy of ``controller``, relative to its mount."""
    for line in _read(Path("/proc/self/cgroup")).splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return path.lstrip("/")
    return ""


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write(path: Path, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def hints(allowance: Allowance, env: Mapping[str, str]) -> dict[str, str]:
    """Thread counts for a command given ``env``: the caller's own settings, the rest filled in.

    OpenMP, MKL and OpenBLAS threads follow the caller's ``OMP_NUM_THREADS`` (MKL reads
    its own variable first: left unset it would use every core of the allowance), else the
    allowance's core count; torch's compile workers are the allowance's core count.
    """
    math = env.get("OMP_NUM_THREADS", str(len(allowance.cores)))
    filled = {**dict.fromkeys(MATH_THREADS, math), COMPILE_THREADS: str(len(allowance.cores))}
    return {**filled, **env}


def confine(allowance: Allowance) -> str:
    """Hold the calling process (a child before exec) to its cores; say how, or NOT and why.

    Runs before ``evolve.sandbox.isolation.apply``: joining the cgroup writes to the cgroup file
    system, which Landlock then refuses to the command.
    """
    cores = format_list(allowance.cores)
    count = f"{len(allowance.cores)} core(s) ({cores})"
    if allowance.asked and allowance.asked > len(allowance.cores):
        count += f", {allowance.asked} asked: the caller has no more"
    joined, why_not = "", allowance.why_not
    if allowance.cgroup:
        try:
            _write(Path(allowance.cgroup, "cgroup.procs"), "0")
            joined = f"held by the cpuset cgroup {allowance.cgroup}"
        except OSError as exc:
            why_not = f"joining {allowance.cgroup}: {exc.strerror}"
    try:
        os.sched_setaffinity(0, allowance.cores)
    except OSError as exc:
        return f"{NOT}limited: {count} not set ({exc.strerror})"
    if joined:
        return f"{count} {joined}"
    if not allowance.narrower:
        return f"{count}: every core of the machine, by affinity (no cpuset: {why_not})"
    try:
        refused = _refuse_widening()
    except OSError as exc:
        refused = f"{NOT}refused: {exc.strerror}"
    if refused.startswith(NOT):
        return (
            f"{NOT}held: {count} by affinity, which it may widen ({refused}; no cpuset: {why_not})"
        )
    return f"{count} by affinity; {refused} (no cpuset: {why_not})"


def held(allowance: Allowance, value: str, report: Mapping[str, str]) -> str:
    """``value`` from ``confine``, or NOT held where the command, as root, could leave its
    cores: with its writes not confined it may write to the cgroup files, and in a v2
    hierarchy ``clone3(CLONE_INTO_CGROUP)`` starts a child in another cgroup without any
    write (Landlock does not see it; the cgroup files' permissions do, so a command running
    as another uid cannot)."""
    if value.startswith(NOT) or os.geteuid() != 0:
        return value
    writes = report.get("writes", f"{NOT}confined (policy.confine_writes=False)")
    if writes.startswith(NOT):
        return f"{NOT}held: {value}; but as root with writes {writes.removeprefix(NOT)} it may join a wider cpuset"
    if allowance.cgroup and value.endswith(allowance.cgroup) and _is_v2(allowance.cgroup):
        return f"{NOT}held: {value}; but as root it may clone3 a child into a wider cgroup (v2)"
    return value


def _is_v2(cgroup: str) -> bool:
    return Path(cgroup, "cgroup.controllers").exists()


def _refuse_widening() -> str:
    """Make ``sched_setaffinity`` do nothing (and refuse every non-native ABI) by seccomp; say so.

    The call answers success and changes nothing: an error would break programs that pin
    their threads within what they were given (libgomp under ``OMP_PROC_BIND`` fails to start
    its threads), and the affinity they then read back is the allowance.
    """
    machine = platform.machine()
    if machine not in SCHED_SETAFFINITY:
        return f"{NOT}refused: system call numbers of {machine} unknown"
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    ignore = RET_ERRNO | 0  # answered "done", changing nothing
    program = filter_prologue(machine)
    program += [(JEQ_K, 0, 1, SCHED_SETAFFINITY[machine]), (RET_K, 0, 0, ignore)]
    install_filter(program)
    return "sched_setaffinity has no effect (seccomp answers it, changing nothing)"
