"""The sandbox ends every runaway candidate in time, leaves nothing running and isolates it."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from evolve.harness.fitness import sandbox_failure
from evolve.sandbox import identity, unreadable
from evolve.sandbox.isolation import NOT, changed, gaps, snapshot
from evolve.sandbox.process import Limits, Policy, Result, isolation_report, run, scrub_env, start
from evolve.types import EvalStatus

TIMEOUT = 2.0  # long enough for a loaded 2-core CI machine to start Python and fork
PY = sys.executable


def candidate(workdir: Path, code: str, **kwargs) -> Result:
    """Write ``code`` as main.py in ``workdir`` and run it in the sandbox."""
    (workdir / "main.py").write_text(textwrap.dedent(code))
    kwargs.setdefault("limits", Limits(timeout_s=TIMEOUT))
    return run([PY, "main.py"], cwd=workdir, **kwargs)


def alive(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in "ZX"


def pids(workdir: Path) -> list[int]:
    """Pids the candidate wrote into ``workdir/pids`` (one per line)."""
    path = workdir / "pids"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def needs(key: str, policy: Policy | None = None) -> None:
    """Skip when this platform cannot apply the isolation named ``key``."""
    value = isolation_report(policy).get(key, f"{NOT}reported")
    if value.startswith(NOT):
        pytest.skip(f"{key}: {value}")


def assert_ended(
    result: Result, workdir: Path, expected_pids: int, timeout: float = TIMEOUT
) -> None:
    """The command ended within timeout + 2 s and none of the pids it wrote is alive."""
    found = pids(workdir)
    assert len(found) >= expected_pids, (found, result.tail())
    assert result.wall_s < timeout + 2, result.wall_s
    assert not [pid for pid in found if alive(pid)], "processes survived the sandbox"


# --- issue 2, must-show 4: runaway candidates end within timeout + 2 s, nothing left ---------


def test_infinite_loop_is_ended(tmp_path: Path) -> None:
    result = candidate(
        tmp_path, "import os\nopen('pids','w').write(str(os.getpid()))\nwhile True: pass\n"
    )
    assert result.timed_out and result.returncode is None and not result.ok
    assert_ended(result, tmp_path, 1)
    assert sandbox_failure(result).status == EvalStatus.TIMEOUT


def test_fork_that_sleeps_forever_is_ended(tmp_path: Path) -> None:
    code = """
        import os, time
        for _ in range(20):
            if os.fork() == 0:
                open('pids', 'a').write(f'{os.getpid()}\\n')
                time.sleep(1000)
        time.sleep(1000)
    """
    result = candidate(tmp_path, code)
    assert result.timed_out
    assert_ended(result, tmp_path, 20)


def test_50_gb_allocation_is_refused(tmp_path: Path) -> None:
    code = "import os\nopen('pids','w').write(str(os.getpid()))\nx = bytearray(50 << 30)\nprint('allocated')\n"
    result = candidate(tmp_path, code, limits=Limits(timeout_s=10, memory_bytes=8 << 30))
    assert (
        result.returncode == 1
        and "MemoryError" in result.stderr
        and "allocated" not in result.stdout
    )
    assert_ended(result, tmp_path, 1, timeout=10)


def test_growing_allocation_stops_at_the_memory_limit(tmp_path: Path) -> None:
    code = """
        import os
        open('pids', 'w').write(str(os.getpid()))
        chunks = []
        while True:
            chunks.append(b'x' * (16 << 20))  # touched, not just reserved
    """
    result = candidate(tmp_path, code, limits=Limits(timeout_s=10, memory_bytes=256 << 20))
    assert result.returncode == 1 and "MemoryError" in result.stderr
    assert_ended(result, tmp_path, 1, timeout=10)


def test_grandchild_ignoring_sigterm_is_killed(tmp_path: Path) -> None:
    code = """
        import os, signal, time
        if os.fork() == 0:
            if os.fork() == 0:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                open('pids', 'a').write(f'{os.getpid()}\\n')
                while True:
                    time.sleep(1)
            time.sleep(1000)
        time.sleep(1000)
    """
    result = candidate(tmp_path, code)
    assert result.timed_out
    assert_ended(result, tmp_path, 1)


def test_setsid_double_fork_is_killed(tmp_path: Path) -> None:
    code = """
        import os, signal, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                open('pids', 'a').write(f'{os.getpid()}\\n')
                while True:
                    time.sleep(1)
            os._exit(0)
        time.sleep(1000)
    """
    result = candidate(tmp_path, code)
    assert result.timed_out
    assert_ended(result, tmp_path, 1)


@pytest.mark.parametrize(("policy", "key"), [(Policy(), "network"), (Policy(network=True), "shm")])
def test_setsid_double_fork_with_clean_environment_is_killed(
    tmp_path: Path, policy: Policy, key: str
) -> None:
    """Leaves the session and drops the marker variable: only the sandbox's namespace finds it."""
    needs(key, policy)
    code = """
        import os, signal
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stays ignored across exec
                open('pids', 'a').write(f'{os.getpid()}\\n')
                os.execve('/bin/sleep', ['sleep', '1000'], {})
            os._exit(0)
        import time; time.sleep(1000)
    """
    result = candidate(tmp_path, code, policy=policy)
    assert result.timed_out
    assert_ended(result, tmp_path, 1)


def test_process_left_behind_is_reported_and_killed(tmp_path: Path) -> None:
    code = """
        import os, subprocess
        child = subprocess.Popen(['sleep', '1000'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        open('pids', 'w').write(str(child.pid))
        print('main done')
    """
    result = candidate(tmp_path, code)
    assert result.returncode == 0 and not result.timed_out and result.leftover == 1
    assert_ended(result, tmp_path, 1)
    failure = sandbox_failure(result)
    assert failure is not None and failure.status == EvalStatus.REJECTED


def test_daemonized_process_left_behind_is_reported(tmp_path: Path) -> None:
    code = """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.closerange(0, 3)
                open('pids', 'a').write(f'{os.getpid()}\\n')
                time.sleep(1000)
            os._exit(0)
        os.wait()
    """
    result = candidate(tmp_path, code)
    assert result.returncode == 0 and result.leftover == 1
    assert_ended(result, tmp_path, 1)


def test_thread_outliving_main_code_is_ended(tmp_path: Path) -> None:
    code = """
        import os, threading, time
        open('pids', 'w').write(str(os.getpid()))
        threading.Thread(target=time.sleep, args=(1000,)).start()
        print('main done', flush=True)
    """
    result = candidate(tmp_path, code)
    assert result.timed_out and "main done" in result.stdout
    assert_ended(result, tmp_path, 1)


# --- statuses, output, environment, rlimits --------------------------------------------------


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("pass", 0),
        ("raise SystemExit(3)", 3),
        ("import sys; sys.exit('bad')", 1),
        ("import os; os.kill(os.getpid(), 9)", -9),
    ],
)
def test_exit_status(tmp_path: Path, code: str, status: int) -> None:
    result = candidate(tmp_path, code)
    assert result.returncode == status and not result.timed_out
    assert result.ok == (status == 0)


def test_stdin_is_fed_and_a_command_that_ignores_it_still_times_out(tmp_path: Path) -> None:
    result = candidate(tmp_path, "import sys\nprint(sys.stdin.read().upper())", stdin=b"hello")
    assert result.stdout.strip() == "HELLO"
    result = candidate(tmp_path, "import time\ntime.sleep(1000)", stdin=b"x" * (4 << 20))
    assert result.timed_out and result.wall_s < TIMEOUT + 2


def wait_for(path: Path, seconds: float = 120.0) -> None:
    """Until ``path`` exists (the command got that far), at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


def test_a_started_command_prepares_and_works_once_finished(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text(
        "import sys\nopen('ready', 'w').write('1')  # its preparation\nprint(sys.stdin.read().upper())\n"
    )
    started = start([PY, "main.py"], cwd=tmp_path, limits=Limits(timeout_s=TIMEOUT))
    wait_for(tmp_path / "ready")
    time.sleep(TIMEOUT + 0.5)  # waiting for its job does not count against its timeout
    assert started.alive()
    result = started.finish(b"the job")
    assert result.ok and result.stdout.strip() == "THE JOB", result.tail()
    assert not started.alive()
    with pytest.raises(RuntimeError, match="finished once"):
        started.finish(b"again")


def test_a_started_commands_stdout_lines_are_heard_as_they_come(tmp_path: Path) -> None:
    code = """
        import os, time
        print("one", flush=True)
        deadline = time.monotonic() + 30
        while not os.path.exists("go") and time.monotonic() < deadline:  # made when "one" is heard
            time.sleep(0.05)
        print("two" if os.path.exists("go") else "not heard", end="", flush=True)
    """
    (tmp_path / "main.py").write_text(textwrap.dedent(code))
    heard: list[str] = []

    def hear(line: str) -> None:
        heard.append(line)
        (tmp_path / "go").touch()

    result = start([PY, "main.py"], cwd=tmp_path, limits=Limits(timeout_s=60)).finish(b"", hear)
    assert result.ok and result.stdout == "one\ntwo", result.tail()
    assert heard == ["one"]  # a last line without its newline is not heard


def test_a_started_command_finished_without_a_job_reads_end_of_file(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text("import sys\nprint(repr(sys.stdin.read()))\n")
    started = start([PY, "main.py"], cwd=tmp_path, limits=Limits(timeout_s=TIMEOUT))
    result = started.finish()
    assert result.ok and result.stdout.strip() == "''", result.tail()


def test_a_started_command_that_is_cancelled_leaves_nothing(tmp_path: Path) -> None:
    code = """
        import subprocess, sys
        child = subprocess.Popen(['sleep', '1000'])
        open('pids', 'w').write(str(child.pid))
        sys.stdin.read()
    """
    (tmp_path / "main.py").write_text(textwrap.dedent(code))
    started = start([PY, "main.py"], cwd=tmp_path, limits=Limits(timeout_s=TIMEOUT))
    wait_for(tmp_path / "pids")
    started.cancel()
    started.cancel()  # a second cancel does nothing
    assert not started.alive() and started.proc.returncode is not None
    assert pids(tmp_path) and not [pid for pid in pids(tmp_path) if alive(pid)]


def test_output_is_capped(tmp_path: Path) -> None:
    code = "import sys\nsys.stdout.write('o' * (5 << 20))\nsys.stderr.write('e' * (5 << 20))\n"
    result = candidate(tmp_path, code, limits=Limits(timeout_s=10, output_bytes=64 << 10))
    assert result.ok and result.truncated
    assert result.stdout.startswith("o" * (64 << 10)) and result.stdout.endswith(
        "[evolve: output truncated]"
    )
    assert len(result.stdout) < (64 << 10) + 100 and len(result.stderr) == 64 << 10


def test_secrets_are_scrubbed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {
        "OPENAI_API_KEY": "sk-1",
        "GITHUB_TOKEN": "gh-2",
        "APP_SECRET": "s-3",
        "AWS_ACCESS_KEY_ID": "a-4",
    }
    for key, value in secrets.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("UNRELATED_SETTING", "u-5")
    result = candidate(
        tmp_path, "import os, json\nprint(json.dumps(dict(os.environ)))", env={"EVOLVE_SEED": "7"}
    )
    seen = json.loads(result.stdout)
    assert not set(secrets) & set(seen) and "UNRELATED_SETTING" not in seen
    assert not any(v in result.stdout for v in ["sk-1", "gh-2", "s-3", "a-4", "u-5"])
    assert seen["EVOLVE_SEED"] == "7" and seen["PATH"] == os.environ["PATH"]
    assert scrub_env({"HF_TOKEN": "x", "PATH": "/bin"}, {"A": "1"}) == {"PATH": "/bin", "A": "1"}


def test_parent_environment_is_unreadable_through_proc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    needs("landlock")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-in-parent")
    code = f"""
        try:
            print(open('/proc/{os.getpid()}/environ', 'rb').read())
        except OSError as exc:
            print('refused', exc.errno)
    """
    result = candidate(tmp_path, code)
    assert "sk-in-parent" not in result.stdout and result.stdout.startswith("refused"), (
        result.tail()
    )


def test_rlimits_are_applied(tmp_path: Path) -> None:
    limits = Limits(timeout_s=10, memory_bytes=1 << 30, cpu_s=5, file_bytes=1 << 20, processes=64)
    code = """
        import resource as r
        print([r.getrlimit(k)[0] for k in (r.RLIMIT_AS, r.RLIMIT_CPU, r.RLIMIT_FSIZE, r.RLIMIT_NPROC, r.RLIMIT_CORE)])
        try:
            open('big', 'wb').write(b'x' * (2 << 20))
        except OSError as exc:
            print('write refused', exc.errno)
    """
    result = candidate(tmp_path, code, limits=limits)
    assert result.stdout.splitlines()[0] == str([1 << 30, 5, 1 << 20, 64, 0])
    assert (
        f"write refused {errno.EFBIG}" in result.stdout
        and (tmp_path / "big").stat().st_size == 1 << 20
    )


def test_cpu_time_limit_stops_a_busy_loop(tmp_path: Path) -> None:
    result = candidate(tmp_path, "while True: pass", limits=Limits(timeout_s=60, cpu_s=1))
    assert result.returncode == -signal.SIGXCPU and not result.timed_out


NOBODY = 65534


def as_nobody(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Run ``argv`` as user nobody (uid and gid 65534, no groups), capturing text output."""
    setpriv = shutil.which("setpriv")
    if setpriv:
        argv = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]
    else:
        kwargs.update(user=NOBODY, group=NOBODY, extra_groups=[])
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, **kwargs)


def python_for_nobody(package_copy: Path) -> str:
    """An interpreter that user nobody can start and that imports the sandbox from ``package_copy``.

    The test's own interpreter may live where nobody cannot read (a virtualenv under /root):
    then its standard library is out of reach. Any other Python >= 3.10 on the machine will
    do, since the sandbox needs only the standard library. Skips when there is none.
    """
    shutil.copytree(Path(__file__).parents[1] / "evolve", package_copy / "evolve")
    for path in [package_copy, *package_copy.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    probe = (
        f"import os, sys; sys.path.insert(0, {str(package_copy)!r}); import evolve.sandbox.process; "
        "assert os.access(sys.executable, os.X_OK), 'cannot run its own sys.executable'"
    )
    tried = {}
    for exe in dict.fromkeys(
        [PY, sys._base_executable, shutil.which("python3"), "/usr/bin/python3"]
    ):
        if not exe or not os.path.exists(exe):
            continue
        try:
            out = as_nobody([exe, "-s", "-c", probe], cwd="/")
        except OSError as exc:
            tried[exe] = str(exc)
            continue
        if out.returncode == 0:
            return exe
        errors = [line for line in out.stderr.splitlines() if "Error" in line]
        tried[exe] = (errors or [f"exit status {out.returncode}"])[-1]
    pytest.skip(
        f"no Python interpreter that user nobody can run with its standard library: {tried}"
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a sandbox as another user")
def test_unprivileged_user_gets_process_limit_and_isolation() -> None:
    """Runs the sandbox as 'nobody': RLIMIT_NPROC binds, namespaces come from a user namespace."""
    root = Path(tempfile.mkdtemp(prefix="evolve-nobody-"))
    try:
        root.chmod(0o755)
        workdir = root / "work"
        workdir.mkdir()
        os.chown(workdir, NOBODY, NOBODY)
        exe = python_for_nobody(root / "lib")
        inner = textwrap.dedent("""
            import json, os, sys
            from pathlib import Path
            sys.path.insert(0, sys.argv[1])
            from evolve.sandbox.process import Limits, run
            code = '''
            import os, time
            made = 0
            try:
                for _ in range(40):
                    if os.fork() == 0:
                        time.sleep(1000)
                    made += 1
            except OSError:
                pass
            print(made)
            '''
            result = run([sys.executable, '-c', code], cwd=Path(sys.argv[2]), limits=Limits(timeout_s=10, processes=10))
            print(json.dumps({'made': int(result.stdout), 'leftover': result.leftover, 'isolation': result.isolation}))
        """)
        out = as_nobody([exe, "-s", "-c", inner, str(root / "lib"), str(workdir)], cwd="/")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["made"] < 10 and seen["leftover"] == seen["made"]
    if not seen["isolation"]["network"].startswith(NOT):
        assert "user namespace" in seen["isolation"]["network"]


# --- issue 8: network, writes, read-only and hidden paths ---------------------------------


def test_no_tcp_connection_to_the_host(tmp_path: Path) -> None:
    needs("network")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.2)
        port = server.getsockname()[1]
        code = f"""
            import socket
            try:
                socket.create_connection(('127.0.0.1', {port}), timeout=2)
                print('connected')
            except OSError as exc:
                print('blocked', exc)
        """
        result = candidate(tmp_path, code, limits=Limits(timeout_s=10))
        assert result.stdout.startswith("blocked"), result.tail()
        with pytest.raises(TimeoutError):
            server.accept()
        allowed = candidate(
            tmp_path, code, limits=Limits(timeout_s=10), policy=Policy(network=True)
        )
        assert allowed.stdout.startswith("connected"), allowed.tail()
        server.accept()[0].close()


def test_private_loopback_works_inside_the_sandbox(tmp_path: Path) -> None:
    """torchrun and NCCL talk over loopback inside one evaluation."""
    needs("network")
    code = """
        import socket
        server = socket.create_server(('127.0.0.1', 0))
        client = socket.create_connection(server.getsockname())
        conn, _ = server.accept()
        client.sendall(b'ping')
        print(conn.recv(4).decode())
    """
    assert candidate(tmp_path, code).stdout.strip() == "ping"


def test_writes_are_confined_to_the_workdir(tmp_path: Path) -> None:
    needs("writes")
    workdir, outside, cache = tmp_path / "work", tmp_path / "outside", tmp_path / "cache"
    for path in (workdir, outside, cache):
        path.mkdir()
    code = f"""
        import os
        for target in ['out.txt', os.environ['HOME'] + '/h', os.environ['TMPDIR'] + '/t', '{cache}/c',
                       '{outside}/o', '/tmp/evolve-escape-{os.getpid()}']:
            try:
                open(target, 'w').write('x')
                print('wrote', target)
            except OSError as exc:
                print('refused', target, exc.errno)
    """
    result = candidate(workdir, code, policy=Policy(writable=[cache]))
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["wrote"] * 4 + ["refused"] * 2, result.tail()
    assert str(workdir) in result.stdout.splitlines()[1]  # HOME is inside the workdir
    assert not (outside / "o").exists() and not Path(f"/tmp/evolve-escape-{os.getpid()}").exists()


def test_readonly_harness_file_cannot_be_changed(tmp_path: Path) -> None:
    needs("readonly", Policy(readonly=[__file__]))
    harness = tmp_path / "harness.py"
    harness.write_text("SCORE = 'honest'\n")
    code = """
        import os
        for attempt in (lambda: open('harness.py', 'w').write('SCORE = 1e9'),
                        lambda: os.remove('harness.py'),
                        lambda: os.rename('main.py', 'harness.py'),
                        lambda: os.chmod('harness.py', 0o777)):
            try:
                attempt()
                print('changed')
            except OSError as exc:
                print('refused', exc.errno)
    """
    result = candidate(tmp_path, code, policy=Policy(readonly=[harness]))
    assert result.stdout.split().count("refused") == 4, result.tail()
    assert harness.read_text() == "SCORE = 'honest'\n" and result.modified == ()


def test_changes_to_readonly_paths_are_detected(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("1")
    before = snapshot([str(tmp_path)])
    time.sleep(0.01)
    (tmp_path / "a.txt").write_text("2")
    (tmp_path / "b.txt").write_text("new")
    assert changed(before, snapshot([str(tmp_path)])) == (
        str(tmp_path / "a.txt"),
        str(tmp_path / "b.txt"),
    )


def test_hidden_paths_cannot_be_read(tmp_path: Path) -> None:
    secret, public, workdir = tmp_path / "val", tmp_path / "public.txt", tmp_path / "work"
    secret.mkdir()
    workdir.mkdir()
    (secret / "labels.txt").write_text("answers")
    public.write_text("fine")
    policy = Policy(hidden=[secret])
    needs("hidden", policy)
    code = f"""
        for path in ['{public}', '{secret}/labels.txt']:
            try:
                print('read', open(path).read())
            except OSError as exc:
                print('refused', exc.errno)
    """
    result = candidate(workdir, code, policy=policy)
    assert result.stdout.split() == ["read", "fine", "refused", str(errno.EACCES)], result.tail()


def test_isolation_report_names_every_protection(tmp_path: Path) -> None:
    report = isolation_report()
    assert {"network", "landlock", "writes", "capabilities"} <= set(report)
    assert gaps({"network": f"{NOT}isolated: x", "writes": "confined"}) == {
        "network": f"{NOT}isolated: x"
    }
    if os.geteuid() == 0 and not report["capabilities"].startswith(NOT):
        result = candidate(tmp_path, "print(open('/proc/self/status').read())")
        assert (
            "CapEff:\t0000000000000000" in result.stdout
            and "CapBnd:\t0000000000000000" in result.stdout
        )


def test_strict_policy_runs_when_everything_applies(tmp_path: Path) -> None:
    policy = Policy(strict=True, readonly=[tmp_path / "main.py"])
    if gaps(isolation_report(Policy(readonly=[__file__]))):
        pytest.skip("this platform lacks some protection; strict would refuse")
    (tmp_path / "main.py").write_text("")
    assert candidate(tmp_path, "print('ok')", policy=policy).stdout.strip() == "ok"


def test_private_shared_memory(tmp_path: Path) -> None:
    """NCCL and DataLoader workers need /dev/shm; each sandbox gets an empty one of its own."""
    needs("shm")
    code = f"""
        import os
        from multiprocessing import shared_memory
        block = shared_memory.SharedMemory(create=True, size=1 << 20)
        block.buf[:4] = b'ping'
        print(sorted(os.listdir('/dev/shm')) == [block.name], bytes(block.buf[:4]).decode())
        open('/dev/shm/evolve-{os.getpid()}', 'w').write('left behind')
    """
    result = candidate(tmp_path, code)
    assert result.stdout.split() == ["True", "ping"], result.tail()
    assert not Path(f"/dev/shm/evolve-{os.getpid()}").exists()


# --- what the GPU benchmarks need: torchrun, torch.compile, CUDA, Triton, NCCL -------------

DDP = """
    import os, sys, torch, torch.distributed as dist
    backend = sys.argv[1]
    dist.init_process_group(backend)
    rank = dist.get_rank()
    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    t = torch.ones(4, device=device) * (rank + 1)
    dist.all_reduce(t)
    print("rank", rank, t.sum().item(), flush=True)
    dist.destroy_process_group()
"""


def torchrun(workdir: Path, backend: str, procs: int) -> Result:
    (workdir / "ddp.py").write_text(textwrap.dedent(DDP))
    argv = [
        PY,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={procs}",
        "ddp.py",
        backend,
    ]
    return run(argv, cwd=workdir, limits=Limits(timeout_s=300, memory_bytes=None))


@pytest.mark.slow
def test_torchrun_works_inside_the_private_network(tmp_path: Path) -> None:
    """Multi-process training talks over the sandbox's own loopback and /dev/shm."""
    pytest.importorskip("torch")
    needs("network")
    result = torchrun(tmp_path, "gloo", 2)
    assert result.ok and result.leftover == 0, result.tail()
    assert sorted(result.stdout.split()) == sorted(["rank", "0", "12.0", "rank", "1", "12.0"])


@pytest.mark.slow
def test_torch_compile_works_with_private_home_and_tmpdir(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    code = """
        import os, torch
        f = torch.compile(lambda x: (x.sin() ** 2 + x.cos() ** 2).sum())
        print(round(float(f(torch.ones(1000)))))
    """
    result = candidate(tmp_path, code, limits=Limits(timeout_s=300, memory_bytes=None))
    assert result.ok and result.stdout.strip() == "1000", result.tail()
    cache = tmp_path / ".sandbox" / "home" / ".cache" / "inductor"
    assert any(cache.iterdir())  # inductor's cache landed in the workdir (TORCHINDUCTOR_CACHE_DIR)


def _cuda_count() -> int:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch.cuda.device_count()


@pytest.mark.gpu
def test_cuda_triton_and_compile_work_in_the_default_sandbox(tmp_path: Path) -> None:
    """Default Policy (no network, writes confined, no capabilities) with memory_bytes=None."""
    _cuda_count()
    code = """
        import torch, triton, triton.language as tl

        @triton.jit
        def add(x, y, out, n, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(out + i, tl.load(x + i, mask=i < n) + tl.load(y + i, mask=i < n), mask=i < n)

        a = torch.ones(4096, device='cuda')
        out = torch.empty_like(a)
        add[(4,)](a, a, out, 4096, BLOCK=1024)
        f = torch.compile(lambda x: torch.relu(x @ x).sum())
        print(int(out.sum().item()), int((a[:64, None] @ a[None, :64]).sum().item()), f(a[:64].reshape(8, 8)).item() > 0)
    """
    result = candidate(tmp_path, code, limits=Limits(timeout_s=600, memory_bytes=None))
    assert result.ok and result.stdout.split() == ["8192", "4096", "True"], result.tail()


@pytest.mark.gpu
def test_nccl_all_reduce_across_two_gpus_in_the_sandbox(tmp_path: Path) -> None:
    if _cuda_count() < 2:
        pytest.skip("needs two GPUs")
    result = torchrun(tmp_path, "nccl", 2)
    assert result.ok and result.leftover == 0, result.tail()
    assert sorted(result.stdout.split()) == sorted(["rank", "0", "12.0", "rank", "1", "12.0"])


def test_concurrent_sandboxes_never_sweep_each_other(tmp_path: Path) -> None:
    """Namespace ids are reused at once; a finished sandbox must not take another's processes."""
    (tmp_path / "long").mkdir()
    long_code = "import subprocess, time; c = subprocess.Popen(['sleep', '6']); time.sleep(5); print(c.poll())"
    driver = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from evolve.sandbox.process import Limits, run
        r = run([sys.executable, '-c', {long_code!r}], cwd=Path(sys.argv[1]), limits=Limits(timeout_s=30))
        print(r.returncode, r.stdout.strip(), r.leftover)
    """)
    other = subprocess.Popen(
        [PY, "-c", driver, str(tmp_path / "long")], stdout=subprocess.PIPE, text=True
    )
    short = [run(["true"], cwd=tmp_path, limits=Limits(timeout_s=10)) for _ in range(30)]
    out, _ = other.communicate(timeout=60)
    assert all(r.ok and r.leftover == 0 for r in short)
    assert out.split() == ["0", "None", "1"]  # its child was alive until it exited, then swept


def test_a_command_may_write_its_own_proc_entries_but_not_kernel_settings(tmp_path):
    """CUDA's initialisation writes under /proc/self (cuInit fails with error 304 otherwise)."""
    code = "open('/proc/self/comm', 'w').write('mine')\ntry:\n    open('/proc/sys/kernel/hostname', 'w').write('x')\nexcept OSError:\n    print('refused')"
    result = run([sys.executable, "-c", code], cwd=tmp_path, limits=Limits(timeout_s=20))
    assert result.returncode == 0, result.stderr
    assert "refused" in result.stdout


def test_the_run_directory_is_hidden_unless_the_command_is_given_a_folder_in_it(tmp_path):
    """``evolve.sandbox.unreadable``'s paths join every policy's hidden ones; a run directory holding a
    folder the policy gives the command (a compile cache, say) stays readable, not broken."""
    run_dir, work = tmp_path / "run", tmp_path / "work"
    (run_dir / "cache").mkdir(parents=True)
    work.mkdir()
    (run_dir / "archive.db").write_text("every earlier output")
    (run_dir / "cache" / "kernel.bin").write_text("compiled")
    needs("hidden", Policy(hidden=[run_dir]))
    code = f"""
        for path in ['{run_dir}/archive.db', '{run_dir}/cache/kernel.bin']:
            try:
                print('read', open(path).read().split()[0])
            except OSError:
                print('refused')
    """
    with unreadable.hidden(run_dir):
        plain = candidate(work, code)
        given = candidate(work, code, policy=Policy(shared_caches=(str(run_dir / "cache"),)))
    assert plain.stdout.split() == ["refused", "refused"], plain.tail()
    assert given.stdout.split() == ["read", "every", "read", "compiled"], given.tail()


def test_a_package_beside_hidden_data_stays_importable(tmp_path):
    """Python lists every sys.path entry; an entry that contains hidden data must stay listable."""
    root = tmp_path / "root"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("VALUE = 7\n")
    (root / "secret").mkdir()
    (root / "secret" / "val.bin").write_text("validation")
    work = tmp_path / "work"
    work.mkdir()
    secret = str(root / "secret" / "val.bin")
    code = f"import pkg\nprint(pkg.VALUE)\ntry:\n    open({secret!r}).read()\nexcept OSError:\n    print('hidden')"
    result = run(
        [sys.executable, "-P", "-c", code],
        cwd=work,
        limits=Limits(timeout_s=20),
        env={"PYTHONPATH": str(root)},
        policy=Policy(hidden=(str(root / "secret"),)),
    )
    if result.isolation.get("hidden", "").startswith(NOT):
        pytest.skip("Landlock unavailable here")
    assert result.stdout.split() == ["7", "hidden"], result.stderr


def test_a_grandchild_may_write_its_own_proc_entries(tmp_path):
    code = (
        "import subprocess, sys\n"
        "inner = \"open('/proc/self/comm', 'w').write('grandchild'); print('written')\"\n"
        "print(subprocess.run([sys.executable, '-c', inner], capture_output=True, text=True).stdout)"
    )
    result = run([sys.executable, "-c", code], cwd=tmp_path, limits=Limits(timeout_s=20))
    assert "written" in result.stdout, result.stderr


def test_output_tail_keeps_whole_lines_and_says_what_was_cut() -> None:
    lines = [f"line {i:04d} " + "x" * 40 for i in range(100)]
    result = Result(
        returncode=0, stdout="\n".join(lines), stderr="", wall_s=0, timed_out=False, truncated=False
    )
    tail = result.tail(1000)
    head, *kept = tail.split("\n")
    assert kept == lines[-len(kept) :] and 15 <= len(kept) <= 20  # whole lines only
    cut = len("\n".join(lines)) - len("\n".join(kept))
    assert head == f"[... {cut} earlier characters cut]"
    assert result.tail(10**6) == "\n".join(lines)  # short output: unchanged, no marker
    exact = "\n".join(lines[-3:])
    dropped = len("\n".join(lines)) - len(exact)  # a cut at a line boundary keeps that line
    assert result.tail(len(exact)) == f"[... {dropped} earlier characters cut]\n{exact}"


def test_only_unix_sockets_the_harness_names_are_reachable_under_tmp() -> None:
    """A socket the harness names (a clock) works; another host socket under /tmp does not."""
    needs("tmp")
    folder = Path(tempfile.mkdtemp(prefix="evolve-sockets-", dir="/tmp"))
    servers = []
    try:
        for name in ("named", "other"):
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(str(folder / name))
            server.listen(4)
            servers.append(server)
        code = f"""
            import os, socket
            for path in (os.environ['CLOCK'], {str(folder / "other")!r}):
                try:
                    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect(path)
                    print('connected')
                except OSError as exc:
                    print('refused', exc.errno)
        """
        with tempfile.TemporaryDirectory() as work:
            result = candidate(Path(work), code, env={"CLOCK": str(folder / "named")})
        assert result.stdout.split()[:2] == ["connected", "refused"], result.tail()
    finally:
        for server in servers:
            server.close()
        shutil.rmtree(folder, ignore_errors=True)


# --- issue 29: candidates never run as the owner of host files ------------------------------


def own_uid() -> None:
    value = isolation_report().get("uid", f"{NOT}reported")
    if value.startswith(NOT) or not value.split()[-1].strip("()").isdigit():
        pytest.skip(f"this platform runs commands as the caller's uid: {value}")


def test_commands_of_one_evaluation_share_an_unprivileged_uid_that_no_other_has(tmp_path):
    """Each evaluation (``identity.fresh``, as ``run_job`` does) gets a uid of its own; what one
    of its commands writes, in any mode, the next one reads and replaces; the harness reads it."""
    own_uid()
    write = "import os; os.mkdir('d', 0o700); open('d/f', 'w').write('x'); os.chmod('d/f', 0); print(os.getuid(), os.getgid(), os.getgroups())"
    again = "import os; os.chmod('d/f', 0o600); print(open('d/f').read(), os.getuid())"
    uids = []
    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
        with identity.fresh() as uid:
            first = candidate(tmp_path / folder, write)
            second = candidate(tmp_path / folder, again)
        assert first.stdout.split() == [str(uid), str(uid), "[]"], first.tail()
        assert second.stdout.split() == ["x", str(uid)], second.tail()
        assert first.isolation["uid"].endswith(f"({uid})")
        assert (tmp_path / folder / "d" / "f").read_text() == "x"  # the harness reads it
        uids.append(uid)
    assert uids[0] != uids[1] and all(identity.sandboxed(u) and u != 0 for u in uids)


def test_host_files_given_to_a_command_are_readable_but_not_its_own(tmp_path):
    """A host file it reads (in a folder of root's that others could not list) keeps its times,
    mode and attributes: a command running as their owner could change all three."""
    own_uid()
    # mode 0700, as mkdtemp makes it; not under /tmp, where changes land in a private layer
    host = Path(tempfile.mkdtemp(prefix="evolve-host-", dir=Path.home()))
    try:
        data = host / "data.txt"
        data.write_text("shared")
        before = data.stat()
        code = f"""
            import os
            print(open({str(data)!r}).read())
            for name, change in [('utime', lambda p: os.utime(p, (1, 1))), ('chmod', lambda p: os.chmod(p, 0o777)),
                                 ('xattr', lambda p: os.setxattr(p, 'user.bit', b'1'))]:
                try:
                    change({str(data)!r})
                    print(name, 'done')
                except OSError as exc:
                    print(name, 'refused')
        """
        result = candidate(tmp_path, code, env={"DATA": str(data)})
        after = data.stat()
    finally:
        shutil.rmtree(host)
    expected = ["shared", *(f"{n} refused" for n in ("utime", "chmod", "xattr"))]
    assert result.stdout.splitlines() == expected, result.tail()
    assert (after.st_mtime_ns, after.st_mode) == (before.st_mtime_ns, before.st_mode)


def test_a_host_file_linked_into_the_workdir_stays_the_hosts(tmp_path):
    """The workdir becomes the uid's, but never a file with another link (a host file's)."""
    own_uid()
    host = tmp_path / "host.txt"
    host.write_text("root's")
    work = tmp_path / "work"
    work.mkdir()
    os.link(host, work / "linked.txt")
    (work / "own.txt").write_text("the candidate's")
    result = candidate(work, "import os; print(os.stat('own.txt').st_uid == os.getuid())")
    assert result.stdout.split() == ["True"], result.tail()
    assert host.stat().st_uid == os.geteuid()


def test_a_caller_that_could_not_read_back_what_the_uid_writes_keeps_its_own(tmp_path):
    """Without CAP_DAC_OVERRIDE the harness could not read what a command of another uid wrote
    in mode 000: then commands run as the caller, and the report says so."""
    own_uid()
    setpriv = shutil.which("setpriv")
    if not setpriv:
        pytest.skip("needs setpriv")
    code = "from evolve.sandbox.process import isolation_report; print(isolation_report()['uid'])"
    out = subprocess.run([setpriv, "--bounding-set=-dac_override", PY, "-c", code], capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert out.stdout.startswith(NOT) and "CAP_DAC_OVERRIDE" in out.stdout, out.stderr
