"""Red team, circle packing: each known hack is caught with the right reason; honest variants pass.

Every cheat sits inside the seed's EVOLVE-BLOCK (where operators may write anything), so the
edit check lets it through and the harness and sandbox must catch it. Each runs through the
real fitness (``run_job``: fresh workdir, ``evaluate_safely``).
"""

from __future__ import annotations

import math
import sqlite3
import textwrap
import uuid
from pathlib import Path

import pytest
from evolve.benchmarks.circle_packing import fitness as harness
from evolve.benchmarks.circle_packing.fitness import CirclePacking

from evolve.operators.edits import check_edit
from evolve.types import EvalStatus
from tests.redteam.helpers import Listener, assert_caught, digest, evaluate

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
        evaluate(FITNESS, inside_block(code), timeout_s=5), EvalStatus.TIMEOUT, r"timed out"
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
    assert_caught(result, EvalStatus.TIMEOUT, r"timed out")
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


def test_signalling_the_harness_process_is_refused():
    result = evaluate(FITNESS, inside_block("import os; os.kill(os.getppid(), 0)"))
    assert_caught(result, EvalStatus.ERROR, r"PermissionError|Operation not permitted")


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
