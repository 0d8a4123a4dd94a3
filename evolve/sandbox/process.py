"""Run untrusted candidate code in a child process that cannot outlive its timeout.

What it does (Linux; ``Result.isolation`` says which protections this platform applied):
- runs the command in the given working directory (a fresh temp dir), with HOME, TMPDIR,
  the XDG folders and the compile caches pointing inside it (``evolve.sandbox.environment``), in
  its own session and process group;
- rlimits: address space, CPU seconds, file size, number of processes, no core dumps;
- ``evolve.sandbox.cores``: the CPU cores of its allowance (``Limits.cores`` of the caller's own, a
  slot's), held by a cpuset cgroup, else by an affinity it may not widen (seccomp); the
  thread-count variables (``OMP_NUM_THREADS`` ...) follow the caller's, else the allowance;
- an environment from an allow-list, minus anything that looks like a secret
  (``*_API_KEY``, ``*_TOKEN``, ``*_SECRET``, ``*_PASSWORD``, ``AWS_*``, ...);
- stdout/stderr captured up to a byte cap (the rest is discarded, and said so);
- ``evolve.sandbox.isolation``: private network and IPC namespaces (as root, or inside an
  unprivileged user namespace), else Landlock refusing TCP; a private tmpfs on /dev/shm and
  private writable layers over /tmp, /var/tmp and ``Policy.shared_caches``; read-only bind
  mounts over ``Policy.readonly`` (and a check after the run, ``Result.modified``); Landlock
  confining writes to the workdir, ``Policy.writable`` and the device nodes, hiding
  ``Policy.hidden``, scoping signals and abstract unix sockets, and refusing ptrace and
  ``/proc/<pid>/environ`` of outside processes (the parent's secrets); a /proc of its own
  listing only its processes, every entry that is not a process's read-only (as root, the
  kernel's settings and other processes' ``oom_score_adj`` would be writable); every mount
  ``noatime`` (which files it read would show in their access times); seccomp
  refusing the kernel keyring calls and those that read or steer the page cache;
  no-new-privileges and an empty capability bounding set;
- ``evolve.sandbox.identity``: as root, an unprivileged uid of its evaluation's, owner of no host file,
  given its workdir and ``Policy.writable`` folders;
- on timeout SIGTERM to the group, SIGKILL after a grace period; then SIGKILL, until none is
  left, to every process in its session, carrying its marker variable, or inside its private
  namespace (which no descendant can leave); ``Result.leftover`` counts those still alive
  after the command itself exited (work left behind: a red flag for the fitness).

What it does NOT protect against (run untrusted code on a machine you can lose):
- reading whatever the user running evolve can read (the working directory of another
  evaluation running at the same time included), except ``Policy.hidden`` and the paths
  ``evolve.sandbox.unreadable`` names (the run's directory);
- without Landlock (kernel < 5.13, or refused): writes anywhere the user may write, which
  for root means the whole system; without any namespace, UDP and (Landlock < 4) all network;
- pathname unix sockets outside /tmp (e.g. a docker socket) that file permissions let it reach;
- ``Policy.writable`` paths, which every command given them shares;
- the kernel: seccomp filters only the keyring and page-cache calls; a kernel exploit
  escapes everything;
- which pages its reads leave in the page cache (major faults and read times show them to
  the next command; ``evolve.sandbox.pagecache`` drops them before the auditor's strict evaluations);
- memory: ``Limits.memory_bytes`` caps *virtual* address space, which CUDA exhausts at once,
  so GPU programs need ``memory_bytes=None`` and then have no memory cap (no cgroup is used);
  RLIMIT_NPROC counts per uid (the evaluation's own; machine-wide for a caller that is not
  root, and never binding when the uid could not be changed);
- GPU choice: ``CUDA_VISIBLE_DEVICES`` is advisory; every ``/dev/nvidia*`` node is writable;
- without a private namespace, a descendant that leaves the session and scrubs its
  environment escapes the final kill;
- timing side channels, and contention with other sandboxes on the same machine for what
  cores do not divide (memory bandwidth, caches, disks, GPUs).

Isolation runs in the child between fork and exec (``preexec_fn``), so call ``run`` from a
process without other threads that may hold locks (evolve's workers are such processes).
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import selectors
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path

from evolve.sandbox import cores, identity, isolation, unreadable
from evolve.sandbox.environment import environment, scrub_env
from evolve.sandbox.isolation import IsolationError, Policy

__all__ = [
    "IsolationError",
    "Limits",
    "Policy",
    "Result",
    "Started",
    "isolation_report",
    "run",
    "scrub_env",
    "start",
]

log = logging.getLogger(__name__)
MARKER_VAR = "EVOLVE_SANDBOX_ID"
GRACE_S = 1.0
DRAIN_S = 0.5
_warned: set[str] = set()


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Resource limits for one sandboxed command; None leaves a limit unset.

    Attributes:
        timeout_s: wall-clock limit; the whole process tree is killed when it passes.
        memory_bytes: address-space limit (RLIMIT_AS, virtual memory). Use None for CUDA
            programs: CUDA reserves far more virtual memory than any sane limit.
        cpu_s: CPU-seconds limit (RLIMIT_CPU): SIGXCPU when it passes, SIGKILL a second later.
        file_bytes: largest file the command may write (RLIMIT_FSIZE; SIGXFSZ beyond).
        processes: RLIMIT_NPROC, counted per uid over the whole machine (the evaluation's
            own uid, ``evolve.sandbox.identity``); not enforced where the command runs as root.
        output_bytes: bytes of stdout and of stderr kept; the rest is dropped.
        cores: CPU cores the command gets, the first of the caller's affinity (a slot
            worker's: its slot's cores); None: all of them. Held by a cpuset cgroup, else by
            affinity with widening refused (``evolve.sandbox.cores``); thread-count variables follow.
    """

    timeout_s: float = 60.0
    memory_bytes: int | None = 8 << 30
    cpu_s: int | None = None
    file_bytes: int | None = 4 << 30
    processes: int | None = 4096
    output_bytes: int = 1 << 20
    cores: int | None = None


@dataclass(frozen=True, kw_only=True)
class Result:
    """What a sandboxed command did.

    Attributes:
        returncode: exit status; negative for a signal (-9 killed); None after a timeout.
        stdout: captured standard output (decoded, capped).
        stderr: captured standard error (decoded, capped).
        wall_s: seconds from the start (for a command from ``start``: from ``finish``) until
            everything was gone.
        timed_out: the command ran past ``Limits.timeout_s`` and was killed.
        truncated: some output was dropped by the cap.
        leftover: processes still alive after the command itself exited (all killed).
        isolation: what isolation was applied, key by key; values starting with "NOT"
            name a protection that the platform refused.
        modified: ``Policy.readonly`` paths whose files changed, appeared or vanished.
        started_at: monotonic time when the command was given its work: for ``run`` as soon as
            the isolated child was set up, for a command from ``start`` when ``finish`` began.
        exited_at: monotonic time when the command exited (or was killed at its timeout).
    """

    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool
    truncated: bool
    leftover: int = 0
    isolation: dict[str, str] = field(default_factory=dict)
    modified: tuple[str, ...] = ()
    started_at: float = 0.0
    exited_at: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the command exited with status 0 in time."""
        return self.returncode == 0 and not self.timed_out

    def tail(self, chars: int = 4000) -> str:
        """The last whole lines of stderr then stdout within ``chars`` characters, for artifacts.

        When lines were left out, a first line says how many characters; a single last line
        longer than ``chars`` keeps its end.
        """
        text = (self.stderr.strip() + "\n" + self.stdout.strip()).strip()
        if len(text) <= chars:
            return text
        kept = text[-chars:]
        if text[-chars - 1] != "\n" and "\n" in kept:  # drop the partial first line
            kept = kept.split("\n", 1)[1]
        return f"[... {len(text) - len(kept)} earlier characters cut]\n{kept}"


def _child_setup(
    limits: Limits, plan: isolation.Plan, allowance: cores.Allowance, report_fd: int
) -> None:
    """Runs in the child between fork and exec: rlimits, its cores, then isolation, then the report."""
    pairs = (
        (resource.RLIMIT_AS, limits.memory_bytes),
        (resource.RLIMIT_CPU, limits.cpu_s),
        (resource.RLIMIT_FSIZE, limits.file_bytes),
        (resource.RLIMIT_NPROC, limits.processes),
        (resource.RLIMIT_CORE, 0),
    )
    for kind, value in pairs:
        if value is not None:  # CPU: SIGXCPU at the limit (catchable), SIGKILL a second later
            hard = value + 1 if kind == resource.RLIMIT_CPU else value
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(kind, (value, hard))
    try:
        cpu = cores.confine(allowance)  # before isolation: Landlock then refuses cgroup writes
        report = isolation.apply(plan)
        report["cpu"] = cores.held(allowance, cpu, report)
    except Exception as exc:  # anything unexpected: report it, never exec half-isolated
        report = {"error": f"{isolation.NOT}isolated: {type(exc).__name__}: {exc}"}
    os.write(report_fd, "\n".join(f"{k}={v}" for k, v in report.items()).encode())
    os.close(report_fd)
    if "error" in report or (plan.policy.strict and isolation.gaps(report)):
        raise IsolationError("refusing to exec")


def _members(sid: int, marker: bytes, ns: str | None) -> list[int]:
    """Live pids in session ``sid``, carrying ``marker`` in their environment, or in namespace ``ns``."""
    members, me, kind = [], os.getpid(), ns.split(":")[0] if ns else ""
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (me, 2):
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                # fields after the command name: state ppid pgrp session ...
                fields = handle.read().rsplit(b")", 1)[1].split()
            if fields[0] in (b"Z", b"X") or fields[1] == b"2":  # zombie or kernel thread
                continue
            if int(fields[3]) == sid or (kind and os.readlink(f"/proc/{name}/ns/{kind}") == ns):
                members.append(int(name))
                continue
            with open(f"/proc/{name}/environ", "rb") as handle:
                if marker in handle.read():
                    members.append(int(name))
        except (OSError, ValueError, IndexError):
            continue  # gone, or not ours to read
    return members


def _hold_namespace(pid: int, ns: str | None) -> int | None:
    """Open the command's namespace so that it outlives the command until the final sweep.

    Namespace ids (``mnt:[4026532318]``) are inode numbers that the kernel hands out again
    as soon as a namespace dies; without this handle, the sweep after the command exited
    could match, count as leftovers and kill the processes of another sandbox whose new
    namespace got the same number. None when the command is already gone (then nothing of
    it lives in the namespace either, unless it forked within microseconds of starting).
    """
    if not ns:
        return None
    kind = ns.split(":")[0]
    try:
        fd = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    if os.readlink(f"/proc/self/fd/{fd}") != ns:
        os.close(fd)
        return None
    return fd


def _signal_tree(pid: int, marker: bytes, ns: str | None, sig: int) -> int:
    """Send ``sig`` to the group and to every other member; return how many members were found."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    members = _members(pid, marker, ns)
    for member in members:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(member, sig)
    return len(members)


def _kill_all(pid: int, marker: bytes, ns: str | None) -> None:
    """SIGKILL until no member is left (a fork loop may need several rounds)."""
    for _ in range(200):
        if not _signal_tree(pid, marker, ns, signal.SIGKILL):
            return
        time.sleep(0.01)
    log.warning("sandbox %s: processes still alive after 200 SIGKILL rounds", marker.decode())


def _read_capped(
    proc: subprocess.Popen,
    deadline: float,
    cap: int,
    heard: Callable[[str], None] | None = None,
) -> tuple[bytes, bytes, bool, bool]:
    """Drain stdout/stderr until both close (or DRAIN_S after the child exits) or the deadline;
    ``heard`` gets each stdout line as it arrives (without its newline; a line is cut at ``cap``)."""
    buffers = {"out": bytearray(), "err": bytearray()}
    partial = b""  # stdout since its last newline, for ``heard``
    truncated = timed_out = False
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ, "out")
    selector.register(proc.stderr, selectors.EVENT_READ, "err")
    drain_until = None
    while selector.get_map():
        now = time.monotonic()
        if drain_until is None and proc.poll() is not None:
            drain_until = (
                now + DRAIN_S
            )  # the child exited; whatever still holds a pipe is left over
        if drain_until is not None and now >= drain_until:
            break
        remaining = deadline - now
        if remaining <= 0:
            timed_out = True
            break
        for key, _ in selector.select(timeout=min(remaining, 0.1)):
            chunk = os.read(key.fileobj.fileno(), 65536)
            if not chunk:
                selector.unregister(key.fileobj)
                continue
            if heard is not None and key.data == "out":
                *lines, partial = (partial + chunk).split(b"\n")
                partial = partial[:cap]
                for line in lines:
                    heard(line.decode(errors="replace"))
            buf = buffers[key.data]
            room = cap - len(buf)
            if room > 0:
                buf += chunk[:room]
            truncated |= len(chunk) > room
    selector.close()
    return bytes(buffers["out"]), bytes(buffers["err"]), timed_out, truncated


def _warn_once(report: Mapping[str, str]) -> None:
    for key, value in isolation.gaps(report).items():
        if key not in _warned:
            _warned.add(key)
            log.warning("sandbox %s %s (see evolve.sandbox.process.isolation_report())", key, value)


def run(
    argv: Sequence[str],
    *,
    cwd: Path,
    limits: Limits | None = None,
    env: Mapping[str, str] | None = None,
    stdin: bytes | None = None,
    policy: Policy | None = None,
) -> Result:
    """Run ``argv`` in ``cwd`` under ``limits`` and ``policy`` and return what it did.

    Args:
        argv: the command and its arguments.
        cwd: the working directory (a fresh temp dir); always writable by the command.
        limits: resource limits (default ``Limits()``).
        env: variables added to a scrubbed copy of this process's environment (they are
            passed as given, even when they look like secrets).
        stdin: bytes fed to the command's standard input (default: /dev/null).
        policy: isolation options (default ``Policy()``: no network, writes confined to
            ``cwd``, private HOME/TMPDIR, no capabilities).

    Returns:
        The ``Result``. Output beyond ``limits.output_bytes`` per stream is dropped and
        ``truncated`` is set. The command and every descendant are gone when this returns.

    Raises:
        IsolationError: ``policy.strict`` is set and a protection could not be applied, or
            isolating the child failed unexpectedly; the command did not run.
    """
    started = start(
        argv, cwd=cwd, limits=limits, env=env, policy=policy, takes_stdin=stdin is not None
    )
    return started.finish(stdin)


def start(
    argv: Sequence[str],
    *,
    cwd: Path,
    limits: Limits | None = None,
    env: Mapping[str, str] | None = None,
    policy: Policy | None = None,
    takes_stdin: bool = True,
) -> Started:
    """Start ``argv`` as ``run`` does, and return at once: ``finish`` feeds it and collects it.

    For a harness process prepared before it is needed: it imports what it needs, then
    blocks reading its job from stdin, which ``finish`` sends. ``limits.timeout_s`` counts
    from ``finish``; ``cancel`` ends a started command that will not be needed. A command
    that is never finished ends with its reader: when this process exits, its stdin closes.
    Arguments as for ``run`` (``takes_stdin``: stdin is a pipe, else /dev/null).
    """
    limits, policy = limits or Limits(), policy or Policy()
    allowance = cores.plan(limits.cores)
    env = cores.hints(allowance, env or {})  # thread counts: the caller's, else the allowance's
    workdir = Path(cwd).resolve()
    granted = [workdir, *map(Path, (*policy.writable, *policy.readonly, *policy.shared_caches))]
    unseen = [  # a run directory holding what the command is given (a cache, say) stays readable
        p for p in unreadable.paths() if not any(g.resolve().is_relative_to(p) for g in granted)
    ]
    policy = replace(policy, hidden=(*policy.hidden, *unseen))
    tag = uuid.uuid4().hex
    marker = f"{MARKER_VAR}={tag}".encode()
    uid, identity_ = _identity()
    # a uid without an account: getpass.getuser() (torch's default cache folders) reads these
    account = {"USER": f"evolve-{uid}", "LOGNAME": f"evolve-{uid}"} if uid is not None else {}
    full_env = {**account, **environment(workdir, policy.private_home, env), MARKER_VAR: tag}
    named = [*argv[1:], *(part for v in full_env.values() for part in v.split(os.pathsep))]
    plan = isolation.plan(policy, workdir, named, uid, identity_)
    if uid is not None:
        writable = [str(workdir), *(os.path.realpath(p) for p in policy.writable)]
        given = [p for p in (argv[0], *named) if os.path.isabs(p) and os.path.exists(p)]
        reached = [*writable, *plan.readonly, *plan.caches, *plan.hidden, *given]
        identity.grant(uid, writable, reached, kept=plan.readonly)
    before = isolation.snapshot(plan.readonly)
    report_r, report_w = os.pipe()
    try:
        proc = subprocess.Popen(
            list(argv),
            cwd=workdir,
            env=full_env,
            stdin=subprocess.PIPE if takes_stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=lambda: _child_setup(limits, plan, allowance, report_w),  # noqa: PLW1509 - before exec
            close_fds=True,
        )
    except subprocess.SubprocessError as exc:
        os.close(report_w)
        report = _read_report(report_r)
        raise IsolationError(
            f"sandbox refused to run {argv[0]!r}: {isolation.gaps(report) or report}; run as root or enable "
            "user namespaces and Landlock, or relax the Policy (strict=False, network=True, ...)"
        ) from exc
    except BaseException:
        os.close(report_w)
        os.close(report_r)
        raise
    os.close(report_w)
    started = Started(proc=proc, marker=marker, limits=limits, plan=plan, before=before)
    try:
        report = _read_report(report_r)
        ns = report.pop("ns", None)
        report["home"] = (
            "HOME, TMPDIR, XDG and compile caches in the workdir"
            if policy.private_home
            else "the caller's HOME and caches (policy.private_home=False)"
        )
        started.ns_fd = _hold_namespace(proc.pid, ns)
        # an id no longer held may already name another sandbox's namespace
        started.ns = ns if started.ns_fd is not None else None
        started.report = report
        _warn_once(report)
    except BaseException:
        started.cancel()
        raise
    return started


@dataclass(eq=False, kw_only=True)
class Started:
    """A sandboxed command from ``start``: ``finish`` it once, or ``cancel`` it."""

    proc: subprocess.Popen
    marker: bytes
    limits: Limits
    plan: isolation.Plan
    before: dict
    report: dict[str, str] = field(default_factory=dict)
    ns: str | None = None
    ns_fd: int | None = None
    done: bool = False

    def alive(self) -> bool:
        """True while the command runs and has been neither finished nor cancelled."""
        return not self.done and self.proc.poll() is None

    def finish(
        self, stdin: bytes | None = None, heard: Callable[[str], None] | None = None
    ) -> Result:
        """Feed ``stdin``, wait for the command (at most ``limits.timeout_s``) and return what it did;
        ``heard`` gets each line of its stdout as it arrives (a harness process's progress).

        The command and every descendant are gone when this returns.
        """
        if self.done:
            raise RuntimeError("a started sandbox command is finished once")
        self.done = True
        proc, marker, ns, limits = self.proc, self.marker, self.ns, self.limits
        if stdin and self.plan.uid is not None:  # paths in its job, as in its arguments
            for path in identity.paths_in(stdin):
                identity.reach(path)
        begin = time.monotonic()
        try:
            if stdin is not None:
                threading.Thread(target=_feed, args=(proc, stdin), daemon=True).start()
            elif proc.stdin is not None:  # started to take a job and given none: it reads EOF
                proc.stdin.close()
            out, err, timed_out, truncated = _read_capped(
                proc, begin + limits.timeout_s, limits.output_bytes, heard
            )
            if not timed_out:
                try:
                    proc.wait(timeout=max(0.0, begin + limits.timeout_s - time.monotonic()))
                except subprocess.TimeoutExpired:
                    timed_out = True
        # this process is being stopped (SIGTERM, Ctrl-C): take the tree along
        except BaseException:
            self._end()
            raise
        if timed_out:
            _signal_tree(proc.pid, marker, ns, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=GRACE_S)
        exited_at = time.monotonic()
        # Whatever happened, nothing of the child's tree survives this call.
        alive = _members(proc.pid, marker, ns)
        leftover = 0 if timed_out else len([p for p in alive if p != proc.pid])
        self._end(alive=bool(alive))
        modified = isolation.changed(self.before, isolation.snapshot(self.plan.readonly))
        suffix = "\n[evolve: output truncated]" if truncated else ""
        return Result(
            returncode=None if timed_out else proc.returncode,
            stdout=out.decode(errors="replace") + suffix,
            stderr=err.decode(errors="replace"),
            wall_s=time.monotonic() - begin,
            timed_out=timed_out,
            truncated=truncated,
            leftover=leftover,
            isolation=self.report,
            modified=modified,
            started_at=begin,
            exited_at=exited_at,
        )

    def accept_readonly_changes(self) -> None:
        """Take the read-only paths' snapshot again: the caller wrote there after the start
        (e.g. the input a command started ahead will read); ``finish`` reports changes from now."""
        self.before = isolation.snapshot(self.plan.readonly)

    def cancel(self) -> None:
        """End the command and every descendant (a no-op once finished or cancelled)."""
        if not self.done:
            self.done = True
            self._end()

    def _end(self, alive: bool = True) -> None:
        """Kill what is left of the tree (none alive: none can appear, as only a member forks
        a member), release the namespace and the pipes."""
        if alive:
            _kill_all(self.proc.pid, self.marker, self.ns)
        if self.ns_fd is not None:
            os.close(self.ns_fd)
            self.ns_fd = None
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def _identity() -> tuple[int | None, str]:
    """The uid the next command runs as (None: the caller's), and else the report's words for it."""
    uid = identity.current()
    refused = identity.usable(uid)
    if not refused:
        return uid, ""
    if identity.sandboxed(os.geteuid()):
        return None, f"{os.geteuid()}, its caller's (a sandboxed harness process)"
    return None, f"{isolation.NOT}changed: {refused}; it owns the caller's files"


def _read_report(fd: int) -> dict[str, str]:
    with os.fdopen(fd, "rb") as handle:
        lines = handle.read().decode(errors="replace").splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def _feed(proc: subprocess.Popen, data: bytes) -> None:
    """Write stdin from a thread, so a command that never reads cannot stall the timeout."""
    with contextlib.suppress(OSError):
        try:
            proc.stdin.write(data)
        finally:
            proc.stdin.close()


@cache
def isolation_report(policy: Policy | None = None) -> dict[str, str]:
    """What isolation this machine applies for ``policy``: runs ``true`` once and reports.

    Keys: ``network``, ``ipc``, ``shm``, ``tmp``, ``proc``, ``atime``, ``home``, ``keyrings``,
    ``page_cache``, ``uid``,
    ``abstract_sockets``, ``unix_sockets``, ``writes``, ``landlock``, ``capabilities`` (and
    ``readonly``, ``hidden``, ``shared_caches``, ``namespaces`` when relevant); values
    starting with "NOT" are gaps. ``cpu``: how a command is held to its cores (``evolve.sandbox.cores``).
    """
    import tempfile

    with tempfile.TemporaryDirectory(prefix="evolve-probe-") as tmp:
        result = run(["true"], cwd=Path(tmp), limits=Limits(timeout_s=10), policy=policy)
    return dict(result.isolation)
