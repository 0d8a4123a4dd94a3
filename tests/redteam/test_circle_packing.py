"""Red team, circle packing: each known hack is caught with the right reason; honest variants pass.

Every cheat sits inside the seed's EVOLVE-BLOCK (where operators may write anything), so the
edit check lets it through and the harness and sandbox must catch it. Each runs through the
real fitness (``run_job``: fresh workdir, ``evaluate_safely``). Issue 15's classes that apply:
1, work outside the budget (the budget is CPU time over the whole process tree, so parallel
search and searching until a wall-clock deadline buy nothing), and 3, state carried between
evaluations (a program that resumes from the packing an earlier evaluation left somewhere
scores another evaluation's work: the issue's 2.6239 for code that computes 2.6143). Classes
2 and 4 concern trained models and do not apply.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest
from evolve.benchmarks.circle_packing import fitness as harness
from evolve.benchmarks.circle_packing.fitness import CirclePacking

from evolve.launch import runner
from evolve.operators.edits import check_edit
from evolve.sandbox.process import isolation_report
from evolve.types import EvalStatus
from tests.conftest import composed
from tests.redteam.helpers import Listener, assert_caught, digest, evaluate, reason

SEED_DIR = Path(harness.__file__).parent / "seed"
SEED = {"packing.py": (SEED_DIR / "packing.py").read_text()}
END = "# EVOLVE-BLOCK-END"
FITNESS = CirclePacking()


def inside_block(code: str, files: dict[str, str] = SEED) -> dict[str, str]:
    """The seed with ``code`` appended inside its EVOLVE-BLOCK (an edit operators may make)."""
    text = files["packing.py"]
    changed = {
        **files,
        "packing.py": text.replace(END, textwrap.dedent(code).strip() + "\n" + END, 1),
    }
    check_edit(files, changed, lambda path: path == "packing.py")  # the search would evaluate it
    return changed


@pytest.fixture(scope="module")
def honest_score() -> float:
    result = evaluate(FITNESS, SEED)
    assert result.ok, result.artifacts
    return result.fitness


def at_exit(code: str) -> str:
    """``code`` (dedented) after importing atexit and json."""
    return "import atexit, json\n" + textwrap.dedent(code)


# --- cheats -----------------------------------------------------------------------------------


def test_a_printed_metric_without_a_packing_is_invalid():
    result = evaluate(
        FITNESS,
        inside_block("print('sum_radii: 3.0'); print('{\"sum_radii\": 3.0}'); raise SystemExit(0)"),
    )
    assert_caught(result, EvalStatus.INVALID, r"no readable packing\.json")


def test_a_printed_metric_next_to_a_real_packing_is_ignored(honest_score):
    code = at_exit("atexit.register(lambda: print('sum_radii: 9.99'))")
    result = evaluate(FITNESS, inside_block(code))
    assert (
        result.ok and result.fitness == honest_score and result.metrics["sum_radii"] == honest_score
    )


def test_exiting_early_with_status_0_is_invalid():
    result = evaluate(FITNESS, inside_block("import os; os._exit(0)"))
    assert_caught(result, EvalStatus.INVALID, r"no readable packing\.json")


def test_a_stale_packing_shipped_with_the_candidate_is_deleted_before_the_run():
    fake = '{"centers": [[0.5, 0.5]], "radii": [0.5]}'
    result = evaluate(FITNESS, {**inside_block("raise SystemExit(0)"), "packing.json": fake})
    assert_caught(result, EvalStatus.INVALID, r"no readable packing\.json")


def test_a_packing_shipped_as_a_folder_is_removed_before_the_run():
    shipped = {"packing.json/centers": "[]", "packing.json/radii": "[]"}
    result = evaluate(FITNESS, {**inside_block("raise SystemExit(0)"), **shipped})
    assert_caught(result, EvalStatus.INVALID, r"no readable packing\.json")


def test_a_centre_that_is_not_a_pair_is_invalid():
    code = at_exit("""
        def _third_axis():
            data = json.load(open("packing.json"))
            data["centers"][3] = [*data["centers"][3], 0.0]
            json.dump(data, open("packing.json", "w"))
        atexit.register(_third_axis)
    """)
    assert_caught(
        evaluate(FITNESS, inside_block(code)), EvalStatus.INVALID, r"circle 3: centre .* not a pair"
    )


def test_nan_radii_are_invalid():
    code = at_exit("""
        def _poison():
            data = json.load(open("packing.json"))
            data["radii"][0] = float("nan")
            json.dump(data, open("packing.json", "w"))
        atexit.register(_poison)
    """)
    assert_caught(
        evaluate(FITNESS, inside_block(code)), EvalStatus.INVALID, r"circle 0: non-finite"
    )


def test_inflated_radii_are_invalid():
    code = at_exit("""
        def _inflate():
            data = json.load(open("packing.json"))
            data["radii"] = [r * 1.05 for r in data["radii"]]
            json.dump(data, open("packing.json", "w"))
        atexit.register(_inflate)
    """)
    assert_caught(
        evaluate(FITNESS, inside_block(code)), EvalStatus.INVALID, r"overlap|leaves the unit square"
    )


def test_radii_grown_into_the_rounding_of_float_checks_are_invalid():
    """Computed in floats, ``x + r`` or a squared distance can round to within its limit when the
    exact value is past it; grown to the last float such checks accept, the seed scores about
    1e-15 more than any exactly valid radii for its centres, with 18 circles over a limit."""
    code = at_exit("""
        import math
        def _fits(c, r, i):
            (x, y), ri = c[i], r[i]
            if x - ri < 0 or x + ri > 1 or y - ri < 0 or y + ri > 1:
                return False
            return all(j == i or (x - a) ** 2 + (y - b) ** 2 >= (ri + r[j]) ** 2 for j, (a, b) in enumerate(c))
        def _grow():
            data = json.load(open("packing.json"))
            c, r = data["centers"], data["radii"]
            for i in range(len(r)):
                step = 1e-6
                while r[i] + step != r[i]:
                    old, r[i] = r[i], r[i] + step
                    if not _fits(c, r, i):
                        r[i], step = old, step / 2
                while True:
                    old, r[i] = r[i], math.nextafter(r[i], 1)
                    if not _fits(c, r, i):
                        r[i] = old
                        break
            json.dump(data, open("packing.json", "w"))
        atexit.register(_grow)
    """)
    assert_caught(
        evaluate(FITNESS, inside_block(code)), EvalStatus.INVALID, r"overlap|leaves the unit square"
    )


def test_patching_the_harness_checker_in_the_candidate_process_changes_nothing():
    code = at_exit("""
        import evolve.benchmarks.circle_packing.fitness as h
        h.check_packing = lambda *a, **k: None
        def _inflate():
            data = json.load(open("packing.json"))
            data["radii"] = [r * 1.05 for r in data["radii"]]
            json.dump(data, open("packing.json", "w"))
        atexit.register(_inflate)
    """)
    assert_caught(
        evaluate(FITNESS, inside_block(code)), EvalStatus.INVALID, r"overlap|leaves the unit square"
    )


def test_an_output_linked_to_an_endless_device_is_refused_quickly():
    code = "import atexit, os\natexit.register(lambda: (os.remove('packing.json'), os.symlink('/dev/zero', 'packing.json')))"
    result = evaluate(FITNESS, inside_block(code))
    assert_caught(result, EvalStatus.INVALID, r"packing\.json.*(link|regular file)")
    assert result.wall_s < 15


def test_an_output_linked_to_a_file_outside_the_workdir_is_refused(tmp_path):
    secret = tmp_path / "secret.json"
    secret.write_text('{"centers": [[0.5, 0.5]], "radii": [0.5]}')
    code = f"import atexit, os\natexit.register(lambda: (os.remove('packing.json'), os.symlink({str(secret)!r}, 'packing.json')))"
    assert_caught(
        evaluate(FITNESS, inside_block(code)),
        EvalStatus.INVALID,
        r"packing\.json.*(link|regular file)",
    )


def test_a_process_left_running_is_rejected():
    code = "import subprocess; subprocess.Popen(['sleep', '60'], start_new_session=True)"
    assert_caught(
        evaluate(FITNESS, inside_block(code)),
        EvalStatus.REJECTED,
        r"left \d+ process\(es\) running",
    )


def test_a_daemon_that_would_rewrite_the_output_later_is_rejected():
    code = """
        import os, time, json
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(5)
                json.dump({"centers": [[0.5, 0.5]], "radii": [9.0]}, open("packing.json", "w"))
            os._exit(0)
    """
    assert_caught(
        evaluate(FITNESS, inside_block(code)),
        EvalStatus.REJECTED,
        r"left \d+ process\(es\) running",
    )


def test_a_thread_that_outlives_the_work_runs_into_the_timeout():
    code = "import threading, time; threading.Thread(target=time.sleep, args=(3600,)).start()"
    assert_caught(
        evaluate(FITNESS, inside_block(code), timeout_s=5),
        EvalStatus.TIMEOUT,
        r"wall limit \d+ s reached",
    )


def test_patched_time_functions_do_not_stretch_the_time_limit():
    code = """
        import time
        time.time = time.monotonic = time.perf_counter = lambda: 0.0
        time.sleep = lambda s: None
        while True:
            pass
    """
    result = evaluate(FITNESS, inside_block(code), timeout_s=3)
    assert_caught(result, EvalStatus.TIMEOUT, r"wall limit \d+ s reached")
    assert result.wall_s < 3 + 5


def test_writing_the_harness_files_is_refused():
    target = Path(harness.__file__)
    before = digest(target)
    result = evaluate(FITNESS, inside_block(f"open({str(target)!r}, 'a').write('# pwned')"))
    assert_caught(
        result, EvalStatus.ERROR, r"(PermissionError|Read-only file system|Permission denied)"
    )
    assert digest(target) == before


def test_writing_the_archive_is_refused(tmp_path):
    db = tmp_path / "archive.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE elites (candidate TEXT, objective REAL)")
        conn.execute("INSERT INTO elites VALUES ('x', 1.0)")
    before = digest(db)
    code = f'import sqlite3\nc = sqlite3.connect({str(db)!r})\nc.execute("UPDATE elites SET objective = 99")\nc.commit()'
    result = evaluate(FITNESS, inside_block(code))
    assert_caught(
        result,
        EvalStatus.ERROR,
        r"(readonly database|unable to open|Permission denied|PermissionError)",
    )
    assert digest(db) == before


def test_writing_outside_the_workdir_is_refused(tmp_path):
    escape = Path("/tmp") / f"evolve-redteam-{uuid.uuid4().hex}"
    sibling = tmp_path / "escape.txt"
    for target in (escape, sibling):
        result = evaluate(FITNESS, inside_block(f"open({str(target)!r}, 'w').write('out')"))
        assert_caught(result, EvalStatus.ERROR, r"(PermissionError|Permission denied)")
        assert not target.exists()


def test_network_connections_fail_and_reach_nothing():
    listener = Listener()
    try:
        code = f"import socket; socket.create_connection(('127.0.0.1', {listener.port}), timeout=3)"
        result = evaluate(FITNESS, inside_block(code))
        assert_caught(
            result, EvalStatus.ERROR, r"(ConnectionRefused|Network is unreachable|PermissionError)"
        )
        assert listener.connections == 0
    finally:
        listener.close()
    code = "import socket; socket.create_connection(('8.8.8.8', 53), timeout=3)"
    result = evaluate(FITNESS, inside_block(code))
    assert_caught(
        result, EvalStatus.ERROR, r"(Network is unreachable|PermissionError|timed out|OSError)"
    )


def test_host_kernel_settings_under_proc_cannot_be_opened_for_writing(honest_score):
    """IRQ affinities and PCI configuration space are root-writable files outside /proc/sys:
    a change there outlives the candidate (a channel to the next one) and reaches the host."""
    code = """
        import glob, os
        _settings = ["/proc/irq/default_smp_affinity", *glob.glob("/proc/irq/*/smp_affinity")]
        for _path in _settings + glob.glob("/proc/bus/pci/*/*"):
            try:
                os.close(os.open(_path, os.O_WRONLY))  # opened only, never written
            except OSError:
                continue
            raise SystemExit(f"opened {_path} for writing")
    """
    result = evaluate(FITNESS, inside_block(code))
    assert result.ok and result.fitness == honest_score, reason(result)


def test_signalling_the_harness_process_is_refused():
    result = evaluate(FITNESS, inside_block("import os; os.kill(os.getppid(), 0)"))
    assert_caught(result, EvalStatus.ERROR, r"PermissionError|Operation not permitted")


# --- class 1: more compute than the budget -------------------------------------------------------

SPIN = "def _spin(seconds=0.8):\n    while time.process_time() < seconds:\n        pass\n"
TIGHT = CirclePacking(cpu_budget_s=2.0)


def test_parallel_search_in_processes_is_charged_to_the_budget():
    code = (
        "import time\nfrom multiprocessing import get_context\n"
        + SPIN
        + ("with get_context('fork').Pool(4) as _pool:\n    _pool.map(_spin, [0.8] * 4)")
    )
    assert_caught(
        evaluate(TIGHT, inside_block(code), timeout_s=300),
        EvalStatus.TIMEOUT,
        r"CPU budget 2 s exceeded.*CPU seconds",
    )


def test_parallel_search_in_threads_is_charged_to_the_budget():
    code = (
        "import time, threading\n"
        + SPIN.replace("process_time()", "thread_time()")
        + (
            "_threads = [threading.Thread(target=_spin) for _ in range(3)]\n"
            "[t.start() for t in _threads]\n[t.join() for t in _threads]"
        )
    )
    assert_caught(
        evaluate(TIGHT, inside_block(code), timeout_s=300),
        EvalStatus.TIMEOUT,
        r"CPU budget 2 s exceeded.*CPU seconds",
    )


def test_parallel_search_in_orphaned_processes_is_charged_to_the_budget():
    # grandchildren whose parent exits first are re-parented; they finish before the program does
    code = (
        "import os, time\n"
        + SPIN
        + (
            "for _ in range(4):\n"
            "    if os.fork() == 0:\n"
            "        if os.fork() == 0:\n"
            "            _spin()\n"
            "            open(f'done-{os.getpid()}', 'w').close()\n"
            "        os._exit(0)\n"
            "    os.wait()\n"
            "while len([f for f in os.listdir('.') if f.startswith('done-')]) < 4:\n"
            "    time.sleep(0.05)"
        )
    )
    assert_caught(
        evaluate(TIGHT, inside_block(code), timeout_s=300),
        EvalStatus.TIMEOUT,
        r"CPU budget 2 s exceeded.*CPU seconds",
    )


def test_a_search_ignoring_the_cpu_limit_signal_is_stopped_and_charged():
    code = (
        "import signal, time\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\n" + SPIN + "_spin(60)"
    )
    result = evaluate(TIGHT, inside_block(code), timeout_s=300)
    assert_caught(result, EvalStatus.TIMEOUT, r"CPU budget 2 s exceeded.*CPU seconds")
    assert result.metrics["cpu_s"] < 10  # RLIMIT_CPU ended it, not the wall-clock timeout


def test_a_wall_limit_timeout_names_the_wall_limit_and_the_unspent_budget():
    """A program stopped by the wall clock before its CPU budget is told so, not "timed out"
    (and the artifact ``limit: wall`` lets the auditor retry such a strict re-run)."""
    result = evaluate(TIGHT, inside_block("import time\ntime.sleep(60)"), timeout_s=2)
    assert_caught(
        result,
        EvalStatus.TIMEOUT,
        r"wall limit 2 s reached after \d+\.\d of the 2 CPU seconds: the CPU budget was not reached",
    )
    assert result.artifacts["limit"] == "wall" and result.metrics["cpu_s"] < 2
    spun = evaluate(TIGHT, inside_block("import time\n" + SPIN + "_spin(60)"), timeout_s=300)
    assert spun.artifacts["limit"] == "cpu"


# --- class 3: state carried from one evaluation to the next ---------------------------------------

RESUME = """
import os
def _store(key, text):
    {store}
def _load(key):
    {load}
try:
    _prior = json.loads(_load("evolve-redteam-packing"))
    print("resumed from", _prior, flush=True)
    raise SystemExit(3)  # a later evaluation found what an earlier one left
except SystemExit:
    raise
except Exception:
    pass
try:
    _store("evolve-redteam-packing", json.dumps({{"seen": True}}))
except Exception as exc:
    print("could not store:", exc)
"""
CHANNELS = {
    "System V shared memory": (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmat.restype = ctypes.c_void_p\n"
        "seg = libc.shmget(0x5EED26, 4096, 0o1666)\naddr = libc.shmat(seg, None, 0)\n"
        "ctypes.memmove(addr, text.encode() + b'\\0', len(text) + 1)",
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmat.restype = ctypes.c_void_p\n"
        "seg = libc.shmget(0x5EED26, 4096, 0o666)\nassert seg >= 0\n"
        "text = ctypes.string_at(libc.shmat(seg, None, 0)).decode()\nassert text\nreturn text",
        "ipc",
    ),
    "POSIX shared memory in /dev/shm": (
        "open('/dev/shm/' + key, 'w').write(text)",
        "return open('/dev/shm/' + key).read()",
        "shm",
    ),
    "a file in /tmp": (
        "open('/tmp/' + key, 'w').write(text)",
        "return open('/tmp/' + key).read()",
        "writes",
    ),
    "the working directory's parent": (
        "open('../' + key, 'w').write(text)",
        "return open('../' + key).read()",
        "writes",
    ),
    "a read-only folder in the working directory": (  # outlives a cleanup without root's rights
        "os.makedirs('kept', exist_ok=True)\nopen('kept/' + key, 'w').write(text)\nos.chmod('kept', 0o555)",
        "import glob\nreturn open(glob.glob('/tmp/evolve-*/kept/' + key)[0]).read()",
        "writes",
    ),
    "the harness process's /proc entries": (  # oom_score_adj: any value in 0..1000, no capability
        "open(f'/proc/{os.getppid()}/oom_score_adj', 'w').write(str(len(text) % 1000 + 1))",
        "kept = open(f'/proc/{os.getppid()}/oom_score_adj').read().strip()\n"
        "assert kept != '0'\nreturn json.dumps(kept)",
        "proc",
    ),
}


@pytest.mark.parametrize("channel", sorted(CHANNELS))
def test_a_program_cannot_resume_from_what_an_earlier_evaluation_left(channel):
    store, load, key = CHANNELS[channel]
    closed = isolation_report().get(key, "NOT reported by this sandbox")
    if closed.startswith("NOT"):
        pytest.skip(f"this sandbox does not close it: {key}: {closed}")
    indent = "\n    "
    code = RESUME.format(store=store.replace("\n", indent), load=load.replace("\n", indent))
    files = inside_block("import json\n" + code)
    oom = Path("/proc/self/oom_score_adj")
    before = oom.read_text()
    try:
        first = evaluate(FITNESS, files)
        second = evaluate(FITNESS, files)
    finally:  # a segment that escaped the sandbox's namespace would outlive the test
        subprocess.run(["ipcrm", "-M", "0x5EED26"], capture_output=True, check=False)
        oom.write_text(before)  # the harness process (this one) as it was
    assert first.ok, first.artifacts
    assert second.ok and second.fitness == first.fitness, (channel, second.status, second.artifacts)


def test_a_file_read_keeps_its_access_time():
    """Under relatime, the first read of a file since its last change updates its access time:
    the next program sees which files were read, a bit for every file nothing else reads (the
    file lies in HOME: under /tmp the program reads it through its private layer)."""
    closed = isolation_report().get("atime", "NOT reported by this sandbox")
    if closed.startswith("NOT"):
        pytest.skip(f"this sandbox does not close it: atime: {closed}")
    with tempfile.TemporaryDirectory(dir=Path.home()) as folder:
        Path(folder).chmod(0o755)  # readable by the program's own uid (``evolve.sandbox.identity``)
        unread = Path(folder) / "unread.txt"
        unread.write_text("a bit")
        os.utime(unread, (1, unread.stat().st_mtime))  # older than its change: a read updates it
        result = evaluate(FITNESS, inside_block(f"open({str(unread)!r}).read()"))
        assert result.ok, reason(result)
        assert unread.stat().st_atime == 1


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="needs root and setpriv, to run as root without its override of file permissions",
)
def test_a_read_only_folder_does_not_outlive_a_cleanup_without_roots_rights():
    """A harness run by a plain user cannot unlink a file in a folder its candidate made
    read-only; unless its cleanup makes the folder writable first, the file stays in the host's
    /tmp. Root without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH stands in for that user."""
    drop = "--bounding-set=-dac_override,-dac_read_search"
    test = f"{__file__}::test_a_program_cannot_resume_from_what_an_earlier_evaluation_left"
    result = subprocess.run(
        [shutil.which("setpriv"), drop, sys.executable, "-m", "pytest", "-q", "-p",
         "no:cacheprovider", f"{test}[a read-only folder in the working directory]"],
        capture_output=True, text=True, cwd=Path(__file__).parents[2], timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]


def test_a_program_in_a_run_cannot_read_the_runs_archive(tmp_path):
    """The run's directory holds archive.db: every earlier candidate's code and evaluation, the
    output it printed included; a program that prints its packing and reads the archive could
    resume from the best earlier one. Through a real run: the seed says whether it could read."""
    run_dir, seed = tmp_path / "run", tmp_path / "seed"
    seed.mkdir()
    peek = f"""
        try:
            open({str(run_dir / "archive.db")!r}, "rb").read(16)
            print("read the run's archive")
        except OSError as exc:
            print("could not read the run's archive:", exc)
    """
    (seed / "packing.py").write_text(inside_block(peek)["packing.py"])
    cfg = composed(["search.max_candidates=1", "search.workers=1"], toy=False)
    cfg["benchmark"]["seed"] = str(seed)
    runner.run(cfg, run_dir)
    with contextlib.closing(sqlite3.connect(run_dir / "archive.db")) as conn:
        rows = conn.execute("SELECT artifacts FROM evaluations").fetchall()
    outputs = [json.loads(artifacts).get("output", "") for (artifacts,) in rows]
    assert outputs and all("could not read the run's archive" in o for o in outputs), outputs


# --- honest variants: every one must pass -------------------------------------------------------

HONEST = {
    "seed": "",
    "other RNG seed 2": "RNG_SEED = 2",
    "other RNG seed 3": "RNG_SEED = 3",
    "refactored constants": "ROWS = [5] * 2 + [6] + [5] * 2  # same rows, written differently\nSTEPS = 200 * 2",
    "progress output": "import sys\nprint('optimising', N, 'circles'); print('warming up', file=sys.stderr)",
    "threads that finish": """
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(4) as pool:
            assert sum(pool.map(abs, range(-50, 50))) == 2500
    """,
    "child processes that finish": """
        import subprocess, sys
        subprocess.run([sys.executable, '-c', 'print(1)'], check=True, capture_output=True)
        from multiprocessing import get_context
        with get_context('fork').Pool(2) as pool:
            assert pool.map(abs, [-1, -2]) == [1, 2]
    """,
    "scratch files in the workdir, HOME and TMPDIR": """
        import os, tempfile
        open('notes.txt', 'w').write('scratch')
        open(os.path.join(os.environ['HOME'], 'cache'), 'w').write('x')
        with tempfile.NamedTemporaryFile() as handle:
            handle.write(b'x')
    """,
}


HONEST_RUNS = [("seed", seed) for seed in (0, 1, 987654)] + [
    (name, 7) for name in sorted(HONEST) if name != "seed"
]


@pytest.mark.parametrize(("name", "seed"), HONEST_RUNS)
def test_honest_variants_pass(name, seed, honest_score):
    files = inside_block(HONEST[name]) if HONEST[name] else SEED
    result = evaluate(FITNESS, files, seed=seed)
    assert result.ok, (name, seed, result.status, result.artifacts)
    assert math.isfinite(result.fitness) and result.fitness > 2.0
    if name in {"seed", "refactored constants", "progress output", "threads that finish"}:
        assert result.fitness == honest_score
