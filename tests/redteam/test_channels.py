"""No channel carries a token from one evaluation to the next (issue 15, must-show 2).

Evaluation A (a sandboxed program) writes a random token through one channel and, where the
channel works inside one evaluation, reads it back itself (which proves the reader is right);
evaluation B, a fresh sandbox run under the policy the benchmarks use, tries to read it.
A and B each get a fresh working directory, removed afterwards, as ``run_job`` does. Where
this platform cannot close a channel, the test skips with ``isolation_report()``'s NOT line.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from evolve.sandbox import pagecache
from evolve.sandbox.isolation import NOT
from evolve.sandbox.process import Limits, Policy, Result, isolation_report, run

PRELUDE = """
import ctypes, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
TOKEN, NAME, KEY, OTHER = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
HOSTHOME = sys.argv[5]

def got(data):
    print('got:' + (data.decode(errors='replace') if isinstance(data, bytes) else str(data)), flush=True)

def attempt(what, fn):
    try:
        fn()
    except Exception as exc:
        print(what, 'failed:', type(exc).__name__, exc, flush=True)

def put_file(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, 'w').write(TOKEN)

def get_file(path):
    got(open(path).read())

def daemon(serve):
    '''Fork a daemon (new session, double fork) that serves TOKEN until killed.'''
    r, w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            server = serve()
            os.write(w, b'ready')
            while True:
                conn, _ = server.accept()
                conn.sendall(TOKEN.encode())
                conn.close()
        os._exit(0)
    os.read(r, 5)

def fetch(family, address):
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        sock.connect(address)
        got(sock.recv(64))

def keyctl(*args):
    return libc.syscall(250 if os.uname().machine == 'x86_64' else 219, *args)
"""

# channel -> (writer, reader); both run after PRELUDE; OTHER is the path A's workdir had.
CHANNELS = {
    "sysv_shm": (
        "sid = libc.shmget(KEY, 64, 0o1666); assert sid >= 0, ctypes.get_errno()\n"
        "ctypes.memmove(libc.shmat(sid, None, 0), TOKEN.encode(), len(TOKEN))",
        "sid = libc.shmget(KEY, 0, 0); assert sid >= 0, ctypes.get_errno()\n"
        "got(ctypes.string_at(libc.shmat(sid, None, 0), len(TOKEN)))",
    ),
    "sysv_msg": (
        "qid = libc.msgget(KEY, 0o1666); assert qid >= 0, ctypes.get_errno()\n"
        "msg = ctypes.create_string_buffer(ctypes.c_long(1).value.to_bytes(8, 'little') + TOKEN.encode(), 72)\n"
        "assert libc.msgsnd(qid, msg, 64, 0) == 0, ctypes.get_errno()",
        "qid = libc.msgget(KEY, 0); assert qid >= 0, ctypes.get_errno()\n"
        "buf = ctypes.create_string_buffer(72)\n"
        "n = libc.msgrcv(qid, buf, 64, ctypes.c_long(0), 0o4000); assert n > 0, ctypes.get_errno()\n"
        "libc.msgsnd(qid, buf, 64, 0)\n"
        "got(buf.raw[8:8 + len(TOKEN)])",
    ),
    "sysv_sem": (
        "sem = libc.semget(KEY, 1, 0o1666); assert sem >= 0, ctypes.get_errno()\n"
        "assert libc.semctl(sem, 0, 16, int(TOKEN)) == 0, ctypes.get_errno()",
        "sem = libc.semget(KEY, 1, 0); assert sem >= 0, ctypes.get_errno()\n"
        "got(libc.semctl(sem, 0, 12))",
    ),
    "posix_mqueue": (
        "q = libc.mq_open(('/' + NAME).encode(), 0o102, 0o600, None); assert q >= 0, ctypes.get_errno()\n"
        "assert libc.mq_send(q, TOKEN.encode(), len(TOKEN), 0) == 0, ctypes.get_errno()",
        "q = libc.mq_open(('/' + NAME).encode(), 0o4002, 0o600, None); assert q >= 0, ctypes.get_errno()\n"
        "buf = ctypes.create_string_buffer(1 << 14)\n"
        "n = libc.mq_receive(q, buf, 1 << 14, None); assert n > 0, ctypes.get_errno()\n"
        "libc.mq_send(q, buf.raw[:n], n, 0)\n"
        "got(buf.raw[:n])",
    ),
    "dev_shm": ("put_file('/dev/shm/' + NAME)", "get_file('/dev/shm/' + NAME)"),
    "tmp": ("put_file('/tmp/' + NAME)", "get_file('/tmp/' + NAME)"),
    "var_tmp": ("put_file('/var/tmp/' + NAME)", "get_file('/var/tmp/' + NAME)"),
    "home": (
        "put_file(os.environ['HOME'] + '/' + NAME)",
        "attempt('own', lambda: get_file(os.environ['HOME'] + '/' + NAME))\n"
        "get_file(OTHER + '/.sandbox/home/' + NAME)",
    ),
    "caches": (
        "for var in ('XDG_CACHE_HOME', 'TRITON_CACHE_DIR', 'TORCHINDUCTOR_CACHE_DIR'):\n"
        "    put_file(os.environ[var] + '/' + NAME)\n"
        "put_file(os.path.expanduser('~/.cache/' + NAME))\n"
        "put_file(os.path.expanduser('~/.triton/cache/' + NAME))",
        "for var in ('XDG_CACHE_HOME', 'TRITON_CACHE_DIR', 'TORCHINDUCTOR_CACHE_DIR'):\n"
        "    attempt(var, lambda: get_file(os.environ[var] + '/' + NAME))\n"
        "for sub in ('.cache', '.triton/cache', '.cache/triton', '.cache/inductor'):\n"
        "    attempt(sub, lambda: get_file(os.path.expanduser('~/' + sub + '/' + NAME)))\n"
        "    attempt(sub, lambda: get_file(OTHER + '/.sandbox/home/' + sub + '/' + NAME))",
    ),
    "host_home_cache": (
        "put_file(HOSTHOME + '/.cache/' + NAME)",
        "get_file(HOSTHOME + '/.cache/' + NAME)",
    ),
    "next_to_workdir": (
        "put_file(os.path.dirname(os.getcwd()) + '/' + NAME)",
        "get_file(os.path.dirname(OTHER) + '/' + NAME)",
    ),
    "abstract_socket": (
        "def serve():\n"
        "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.bind('\\0' + NAME); s.listen(8); return s\n"
        "daemon(serve)",
        "fetch(socket.AF_UNIX, '\\0' + NAME)",
    ),
    "path_socket": (
        "def serve():\n"
        "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "    try:\n"
        "        s.bind('/tmp/' + NAME)\n"
        "    except OSError:\n"
        "        s.bind(os.getcwd() + '/' + NAME)\n"
        "    s.listen(8); return s\n"
        "daemon(serve)",
        "attempt('tmp', lambda: fetch(socket.AF_UNIX, '/tmp/' + NAME))\n"
        "attempt('own', lambda: fetch(socket.AF_UNIX, os.getcwd() + '/' + NAME))\n"
        "fetch(socket.AF_UNIX, OTHER + '/' + NAME)",
    ),
    "tcp_loopback": (
        "def serve():\n"
        "    s = socket.create_server(('127.0.0.1', KEY % 20000 + 20000)); return s\n"
        "daemon(serve)",
        "fetch(socket.AF_INET, ('127.0.0.1', KEY % 20000 + 20000))",
    ),
    "user_keyring": (
        "k = libc.syscall(248 if os.uname().machine == 'x86_64' else 217, b'user', NAME.encode(), TOKEN.encode(), len(TOKEN), -4)\n"
        "assert k > 0, ctypes.get_errno()",
        "k = keyctl(10, -4, b'user', NAME.encode(), 0); assert k > 0, ctypes.get_errno()\n"
        "buf = ctypes.create_string_buffer(64); n = keyctl(11, k, buf, 64); got(buf.raw[:n])",
    ),
    "session_keyring": (
        "k = libc.syscall(248 if os.uname().machine == 'x86_64' else 217, b'user', NAME.encode(), TOKEN.encode(), len(TOKEN), -3)\n"
        "assert k > 0, ctypes.get_errno()",
        "k = keyctl(10, -3, b'user', NAME.encode(), 0); assert k > 0, ctypes.get_errno()\n"
        "buf = ctypes.create_string_buffer(64); n = keyctl(11, k, buf, 64); got(buf.raw[:n])",
    ),
}
# The isolation_report() key that names the protection closing each channel.
PROTECTION = {
    "sysv_shm": "ipc",
    "sysv_msg": "ipc",
    "sysv_sem": "ipc",
    "posix_mqueue": "ipc",
    "dev_shm": "shm",
    "tmp": "tmp",
    "var_tmp": "tmp",
    "home": "home",
    "caches": "home",
    "host_home_cache": "writes",
    "next_to_workdir": "writes",
    "abstract_socket": "abstract_sockets",
    "path_socket": "unix_sockets",
    "tcp_loopback": "network",
    "user_keyring": "keyrings",
    "session_keyring": "keyrings",
}
# Channels one evaluation may use inside itself (NCCL and DataLoader workers need some).
# Not POSIX message queues: Landlock refuses creating them (nothing in the ML stack does).
WORKS_INSIDE = {"sysv_shm", "sysv_msg", "sysv_sem", "dev_shm", "home"}
WORKS_INSIDE |= {"caches", "abstract_socket", "path_socket", "tcp_loopback"}


@dataclass
class Run:
    result: Result
    workdir: str


def evaluation(
    code: str, args: list[str], policy: Policy | None = None, prelude: str = PRELUDE
) -> Run:
    """One sandboxed evaluation in a fresh workdir, removed afterwards (as ``run_job`` does)."""
    workdir = Path(tempfile.mkdtemp(prefix="evolve-channel-"))
    try:
        (workdir / "main.py").write_text(prelude + "\n" + textwrap.dedent(code))
        result = run(
            [sys.executable, "main.py", *args],
            cwd=workdir,
            limits=Limits(timeout_s=30),
            policy=policy,
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return Run(result, str(workdir))


def needs(key: str, policy: Policy | None = None) -> None:
    value = isolation_report(policy).get(key, f"{NOT}reported")
    if value.startswith(NOT):
        pytest.skip(f"this platform cannot close the channel: {key}: {value}")


@pytest.mark.parametrize("channel", sorted(CHANNELS))
def test_a_token_never_reaches_the_next_evaluation(channel: str) -> None:
    needs(PROTECTION[channel])
    writer, reader = CHANNELS[channel]
    token = str(secrets.randbelow(30000) + 1000) if channel == "sysv_sem" else secrets.token_hex(8)
    name, key = f"evolve-channel-{secrets.token_hex(6)}", secrets.randbelow(1 << 30) + 1
    args = [token, name, str(key), "", os.path.expanduser("~")]
    a = evaluation(f"attempt('write', lambda: exec({writer!r}, globals()))\nexec({reader!r})", args)
    if channel in WORKS_INSIDE:  # the reader is right: inside one evaluation the token arrives
        assert f"got:{token}" in a.result.stdout, a.result.tail()
    assert a.result.leftover == 0 or channel.endswith(("socket", "loopback")), a.result.tail()
    args[3] = a.workdir
    try:
        b = evaluation(reader, args)
    finally:  # where a channel was open, take the token out of the host again
        for folder in ("/tmp", "/var/tmp", "/dev/shm", os.path.expanduser("~/.cache")):
            Path(folder, name).unlink(missing_ok=True)
    assert f"got:{token}" not in b.result.stdout, (channel, b.result.tail())
    assert not b.result.timed_out, b.result.tail()


def test_a_daemon_left_by_an_evaluation_is_killed() -> None:
    """The listener a cheat leaves behind is counted and gone when ``run`` returns."""
    writer = CHANNELS["abstract_socket"][0]
    a = evaluation(writer, ["t", f"evolve-channel-{secrets.token_hex(6)}", "1", "", "/"])
    assert a.result.ok and a.result.leftover >= 1, a.result.tail()


def test_a_shared_cache_is_readable_but_never_written(tmp_path: Path) -> None:
    """A harness-written cache (Policy.shared_caches): read by every candidate, changed by none."""
    cache = tmp_path / "compile-cache"
    cache.mkdir()
    (cache / "warm.bin").write_text("from the harness")
    policy = Policy(shared_caches=[cache])
    needs("shared_caches", policy)
    name, token = f"evolve-channel-{secrets.token_hex(6)}", secrets.token_hex(8)
    writer = f"""
        got(open({str(cache / "warm.bin")!r}).read())
        put_file({str(cache)!r} + '/' + NAME)
        open({str(cache)!r} + '/next', 'w').write(TOKEN)  # as compilers do: a new file, renamed
        os.replace({str(cache)!r} + '/next', {str(cache / "warm.bin")!r})
        get_file({str(cache)!r} + '/' + NAME)
    """
    a = evaluation(writer, [token, name, "1", "", "/"], policy)
    assert "got:from the harness" in a.result.stdout, a.result.tail()
    assert f"got:{token}" in a.result.stdout, a.result.tail()  # its own writes land in its layer
    assert sorted(p.name for p in cache.iterdir()) == ["warm.bin"]
    assert (cache / "warm.bin").read_text() == "from the harness"
    reader = f"get_file({str(cache)!r} + '/' + NAME)\nget_file({str(cache / 'warm.bin')!r})"
    b = evaluation(reader, [token, name, "1", "", "/"], policy)
    assert f"got:{token}" not in b.result.stdout, b.result.tail()


def test_isolation_report_names_every_channel() -> None:
    report = isolation_report()
    assert set(PROTECTION.values()) <= set(report), sorted(set(PROTECTION.values()) - set(report))
    assert "shared_caches" in isolation_report(Policy(shared_caches=[tempfile.gettempdir()]))


def test_tcp_port_of_the_host_is_not_a_channel() -> None:
    """A listener on the host's loopback (outside any sandbox) is unreachable from B."""
    needs("network")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        b = evaluation(
            f"attempt('tcp', lambda: fetch(socket.AF_INET, ('127.0.0.1', {port})))",
            ["t", "n", "1", "", "/"],
        )
    assert "got:" not in b.result.stdout and "failed" in b.result.stdout, b.result.tail()


# The page cache (issue 29, item 2): evaluation A leaves a token in which pages of a large
# readable host file are cached; evaluation B reads it back. Bit i is page i * STRIDE (readahead
# loads at most 32 pages after, and read-around 16 either side of, the page it reads).
PAGE_CACHE = """
import ctypes, mmap, os, resource, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
PAGE, STRIDE, BITS = mmap.PAGESIZE, 128, 16
fd = os.open(sys.argv[2], os.O_RDONLY)
SIZE, SLOTS = os.fstat(fd).st_size, [i * 128 for i in range(16)]

def refused(what):
    raise OSError(ctypes.get_errno(), what + ': ' + os.strerror(ctypes.get_errno()))

def mapped():
    addr = libc.mmap(None, ctypes.c_size_t(SIZE), mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    return addr if addr not in (None, ctypes.c_void_p(-1).value) else refused('mmap')

def by_mincore():
    vec = (ctypes.c_ubyte * (SIZE // PAGE))()
    if libc.mincore(ctypes.c_void_p(mapped()), ctypes.c_size_t(SIZE), vec):
        refused('mincore')
    return [vec[p] & 1 for p in SLOTS]

def by_nowait():
    bits = []
    for p in SLOTS:
        try:
            os.preadv(fd, [bytearray(1)], p * PAGE, os.RWF_NOWAIT)
            bits.append(1)
        except BlockingIOError:
            bits.append(0)
    return bits

def by_cachestat():
    bits = []
    for p in SLOTS:
        span, stat = (ctypes.c_uint64 * 2)(p * PAGE, PAGE), (ctypes.c_uint64 * 5)()
        if libc.syscall(451, fd, span, stat, 0):
            refused('cachestat')
        bits.append(int(stat[0] > 0))
    return bits

def by_faults():  # a page not cached costs a major fault to read; no timing involved
    view, bits = mmap.mmap(fd, SIZE, prot=mmap.PROT_READ), []
    view.madvise(mmap.MADV_RANDOM)  # a fault reads its own page, no read-around
    for p in SLOTS:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
        view[p * PAGE]
        bits.append(int(resource.getrusage(resource.RUSAGE_SELF).ru_majflt == before))
    return bits

def load(bits):  # reading a page caches it: no call to refuse
    for p, bit in zip(SLOTS, bits):
        if bit:
            os.pread(fd, 1, p * PAGE)

def evict_fadvise(bits):
    for p, bit in zip(SLOTS, bits):
        if not bit:
            os.posix_fadvise(fd, p * PAGE, PAGE, os.POSIX_FADV_DONTNEED)

def evict_pageout(bits):
    addr = mapped()  # pageout reclaims the pages this process maps: fault them in first
    for p, bit in zip(SLOTS, bits):
        if not bit and (ctypes.string_at(addr + p * PAGE, 1) is None or libc.madvise(ctypes.c_void_p(addr + p * PAGE), PAGE, 21)):
            refused('madvise(MADV_PAGEOUT)')

def load_willneed(bits):
    for p, bit in zip(SLOTS, bits):
        if bit:
            os.posix_fadvise(fd, p * PAGE, PAGE, os.POSIX_FADV_WILLNEED)

def load_readahead(bits):
    for p, bit in zip(SLOTS, bits):
        if bit and libc.syscall(187 if os.uname().machine == 'x86_64' else 213, fd, ctypes.c_int64(p * PAGE), PAGE):
            refused('readahead')

role, how = sys.argv[1].split(':')
try:
    if role == 'send':
        globals()[how]([int(b) for b in sys.argv[3]])
        print('sent', flush=True)
    else:
        print('got:' + ''.join(map(str, globals()[how]())), flush=True)
except OSError as exc:
    print(role, how, 'failed:', exc, flush=True)
"""
PAGES = 16 * 128  # the file: 16 slots of 128 pages


def page_cache_file(folder: Path) -> Path:
    """A file of PAGES random pages, written to disk and out of the page cache (else skip)."""
    path = folder / "big.bin"
    path.write_bytes(os.urandom(PAGES * 4096))
    path.chmod(0o644)
    return uncached(path)


def uncached(path: Path) -> Path:
    """``path`` with none of its pages in the page cache (else skip)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if "got:" + "0" * 16 not in probe("by_mincore", path).stdout:
        pytest.skip(f"this file system keeps {path} in the page cache after POSIX_FADV_DONTNEED")
    return path


def probe(how: str, path: Path) -> subprocess.CompletedProcess:
    """The receiver ``how`` run outside any sandbox, as the harness could: what the cache holds."""
    return subprocess.run([sys.executable, "-c", PAGE_CACHE, f"receive:{how}", str(path)],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


def cache_evaluation(role: str, how: str, path: Path, bits: str = "") -> Result:
    return evaluation(PAGE_CACHE, [f"{role}:{how}", str(path), bits], prelude="").result


def page_token() -> str:
    """16 random bits, at least one set (A loads its page) and one clear (A evicts its page)."""
    return format(secrets.randbits(14) << 2 | 1, "016b")


def until_proved(attempt: Callable[[str], bool], tries: int = 3) -> None:
    """Run ``attempt`` (its assertions: what the sandbox refused) with fresh tokens until its
    proof holds (the residency outside the sandbox is what it should be). The kernel may reclaim
    a cached page of its own accord when memory runs short (CI shares its machine), which spoils
    one attempt's proof; a sandbox that let the call through would spoil every attempt's."""
    for _ in range(tries):
        if attempt(page_token()):
            return
    pytest.fail(f"in none of {tries} attempts was the residency outside the sandbox as it should")


@pytest.mark.parametrize("receiver", ["by_mincore", "by_nowait", "by_cachestat"])
def test_no_probe_reads_which_pages_are_cached(tmp_path: Path, receiver: str) -> None:
    """A loads the token's pages (it may: it reads them); B's probes are refused, while the same
    probe run outside the sandbox reads the token (proof that it was there to read)."""
    needs("page_cache")
    path = page_cache_file(tmp_path)

    def attempt(token: str) -> bool:
        a = cache_evaluation("send", "load", uncached(path), token)
        assert "sent" in a.stdout, a.tail()
        b = cache_evaluation("receive", receiver, path)
        assert f"got:{token}" not in b.stdout and "failed" in b.stdout, b.tail()
        return f"got:{token}" in probe("by_mincore", path).stdout

    until_proved(attempt)


@pytest.mark.parametrize(
    "sender", ["evict_fadvise", "evict_pageout", "load_willneed", "load_readahead"]
)
def test_no_call_steers_which_pages_are_cached(tmp_path: Path, sender: str) -> None:
    """Evicting chosen pages of a cached file, or loading them without reading, is refused:
    the file's residency after A is what it was before."""
    needs("page_cache")
    path, evicts = page_cache_file(tmp_path), sender.startswith("evict")
    before = ("1" if evicts else "0") * 16

    def attempt(token: str) -> bool:
        if evicts:
            path.read_bytes()  # every page cached; A would evict those of its zeros
        else:
            uncached(path)  # no page cached; A would load those of its ones
        a = cache_evaluation("send", sender, path, token)
        assert "failed" in a.stdout, a.tail()
        after = probe("by_mincore", path).stdout
        assert f"got:{token}" not in after, after
        return f"got:{before}" in after

    until_proved(attempt)


def test_pages_read_before_a_strict_evaluation_are_forgotten(tmp_path: Path) -> None:
    """Reads stay possible, and major faults tell cached pages from others without a clock; the
    page cache is dropped before the auditor's strict re-evaluation (``run_job``), so the
    token never reaches it. Without the drop it would: that is the receiver's proof."""
    needs("page_cache")
    path, token = page_cache_file(tmp_path), page_token()
    assert "sent" in cache_evaluation("send", "load", path, token).stdout
    if f"got:{token}" not in cache_evaluation("receive", "by_faults", path).stdout:
        pytest.skip("major faults do not show which pages are cached on this machine")
    path.unlink()
    path = page_cache_file(tmp_path)
    assert "sent" in cache_evaluation("send", "load", path, token).stdout
    done = pagecache.forget()
    b = cache_evaluation("receive", "by_faults", path)
    assert f"got:{token}" not in b.stdout and "got:" + "0" * 16 in b.stdout, (done, b.tail())


def test_a_host_files_times_and_attributes_carry_no_token() -> None:
    """A command running as the owner of a host file (root, before issue 29) could set its
    modification time and extended attributes (Landlock confines contents, not those), and
    the next evaluation read them back. The file lies outside /tmp's private layer."""
    needs("uid")
    with tempfile.TemporaryDirectory(prefix="evolve-host-", dir=Path.home()) as folder:
        Path(folder).chmod(0o755)
        host = Path(folder) / "data.txt"
        host.write_text("shared")
        token = secrets.randbelow(1 << 30) + 1
        writer = f"""
            import os
            attempt('utime', lambda: os.utime({str(host)!r}, ({token}, {token})))
            attempt('xattr', lambda: os.setxattr({str(host)!r}, 'user.token', b'{token}'))
        """
        reader = f"""
            import os
            got(int(os.stat({str(host)!r}).st_mtime))
            attempt('xattr', lambda: got(os.getxattr({str(host)!r}, 'user.token')))
        """
        args = ["t", "n", "1", "", "/"]
        a = evaluation(writer, args)
        b = evaluation(reader, args)
    assert a.result.stdout.count("failed") == 2, a.result.tail()
    assert f"got:{token}" not in b.result.stdout, b.result.tail()
