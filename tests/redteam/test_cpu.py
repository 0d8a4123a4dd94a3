"""A candidate gets the CPU it is given, no more: threads, processes and a wider affinity add nothing.

Each greedy program runs in the sandbox with one core (``Limits.cores=1``) on this machine's
cpuset cgroups, and again as on a machine without them (affinity with ``sched_setaffinity``
made a no-op). The tests assert what the kernel enforces, not timings: every thread and every
child runs on the one core, and the CPU time the program got is no more than its wall time
(a second core would give up to twice as much), so it cannot train faster than the honest
program that uses the one core it is given.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from evolve.harness.fitness import EvalContext, evaluate_safely
from evolve.sandbox import process as sandbox
from evolve.sandbox.channels import NOT
from tests.fixtures.nanochat_tiny import tiny_fitness
from tests.redteam import nanochat_programs as programs

MACHINE = tuple(sorted(os.sched_getaffinity(0)))
pytestmark = pytest.mark.skipif(len(MACHINE) < 2, reason="needs two cores to give one")
SPIN_S = 1.0
# Shared by the programs: spin() works SPIN_S on every core it can (hashing releases the GIL);
# seen() is the affinity of every thread of this process; report() prints what the kernel gave
# since ``start`` (wall and CPU seconds: used() counts this process, its threads and children).
COMMON = f"""
import hashlib, json, os, resource, sys, threading, time
DATA = bytes(1 << 16)
CORES = os.cpu_count()

def spin():
    end = time.monotonic() + {SPIN_S}
    while time.monotonic() < end:
        hashlib.sha256(DATA).digest()

def seen():
    found = set()
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{{task}}/status") as handle:
            found.add(handle.read().split("Cpus_allowed_list:")[1].split()[0])
    return found

def used():
    return sum(
        getattr(resource.getrusage(who), f)
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
        for f in ("ru_utime", "ru_stime")
    )

def report(start, found, **extra):
    wall, cpu = time.monotonic() - start[0], used() - start[1]
    print(json.dumps({{"wall": wall, "cpu": cpu, "seen": sorted(found), **extra}}))
"""
THREADS = """
start = (time.monotonic(), used())
workers = [threading.Thread(target=spin) for _ in range(2 * CORES)]
for worker in workers:
    worker.start()
found = seen()
for worker in workers:
    worker.join()
report(start, found, threads=len(workers))
"""
PROCESSES = """
start, pids = (time.monotonic(), used()), []
read_end, write_end = os.pipe()
for _ in range(2 * CORES):
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        os.write(write_end, (",".join(seen()) + "\\n").encode())
        spin()
        os._exit(0)
    pids.append(pid)
os.close(write_end)
for pid in pids:
    os.waitpid(pid, 0)
found = set(os.read(read_end, 1 << 16).decode().split())
report(start, found, processes=len(pids))
"""
WIDENS = """
escapes = {}
try:
    os.sched_setaffinity(0, range(CORES))
except OSError as exc:
    escapes["sched_setaffinity"] = exc.strerror
own = [line.split(":", 2)[2] for line in open("/proc/self/cgroup") if ":cpuset:" in line or line.startswith("0::")]
for path in ("/sys/fs/cgroup/cpuset/cgroup.procs", "/sys/fs/cgroup/cgroup.procs",
             *(f"/sys/fs/cgroup/cpuset{p.strip()}/cpuset.cpus" for p in own)):
    try:
        with open(path, "w") as handle:
            handle.write("0" if path.endswith("procs") else f"0-{CORES - 1}")
        escapes[path] = "written"
    except OSError as exc:
        escapes[path] = exc.strerror
start = (time.monotonic(), used())
workers = [threading.Thread(target=spin) for _ in range(2 * CORES)]
for worker in workers:
    worker.start()
found = seen()
for worker in workers:
    worker.join()
report(start, found, escapes=escapes)
"""
TORCH = """
import os, json, torch
torch.set_num_threads(4 * os.cpu_count())
a = torch.randn(512, 512)
for _ in range(10):
    b = a @ a
found = set()
for task in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{task}/status") as handle:
        found.add(handle.read().split("Cpus_allowed_list:")[1].split()[0])
print(json.dumps({"threads": torch.get_num_threads(), "seen": sorted(found), "ok": bool(b.isfinite().all())}))
"""




def greedy(program: str, tmp_path: Path, env: dict[str, str] | None = None) -> dict:
    """Run ``program`` on one core in the sandbox; what it printed, with the sandbox's cpu report."""
    result = sandbox.run(
        [sys.executable, "-c", program],
        cwd=tmp_path,
        limits=sandbox.Limits(cores=1, timeout_s=120, memory_bytes=None),
        env=env,
    )
    assert result.ok, result.tail()
    assert not result.isolation["cpu"].startswith(NOT), result.isolation["cpu"]
    return json.loads(result.stdout.strip().splitlines()[-1])


def assert_one_core(seen: dict) -> None:
    assert seen["seen"] == [str(MACHINE[0])], seen
    # one core gives at most one CPU-second per second (two would give up to two)
    assert seen["cpu"] <= seen["wall"] * 1.02 + 0.05, seen


def test_a_thread_per_core_shares_the_one_core(mode, tmp_path) -> None:
    assert_one_core(greedy(COMMON + THREADS, tmp_path))


def test_a_process_per_core_shares_the_one_core(mode, tmp_path) -> None:
    assert_one_core(greedy(COMMON + PROCESSES, tmp_path))


def test_widening_its_affinity_or_leaving_its_cgroup_gains_nothing(mode, tmp_path) -> None:
    seen = greedy(COMMON + WIDENS, tmp_path)
    assert_one_core(seen)
    assert "written" not in seen["escapes"].values(), seen["escapes"]


def test_torch_with_more_threads_than_cores_and_pinned_threads_runs_on_its_core(
    mode, tmp_path
) -> None:
    pytest.importorskip("torch")
    for bind in ("false", "true"):  # libgomp pins its threads under OMP_PROC_BIND
        seen = greedy(TORCH, tmp_path, env={"OMP_PROC_BIND": bind, "OMP_NUM_THREADS": "8"})
        assert seen["ok"] and seen["threads"] == 4 * len(MACHINE), seen
        assert seen["seen"] == [str(MACHINE[0])], seen


GREEDY_TRAINING = """
import os as _os, threading as _threading
torch.set_num_threads(4 * _os.cpu_count())
try:
    _os.sched_setaffinity(0, range(_os.cpu_count()))
except OSError:
    pass

def _allowed(pid, task):
    with open(f"/proc/{pid}/task/{task}/status") as _handle:
        return _handle.read().split("Cpus_allowed_list:")[1].split()[0]

_child = _os.fork()
if _child == 0:  # a helper process, as a data loader would be
    import time as _time
    _time.sleep(0.5)
    _os._exit(0)
_spare = _threading.Thread(target=lambda: sum(range(10**6)))
_spare.start()
_found = {_allowed(p, t) for p in (_os.getpid(), _child) for t in _os.listdir(f"/proc/{p}/task")}
_spare.join()
_os.waitpid(_child, 0)
print("GREEDY", sorted(_found), torch.get_num_threads(), flush=True)
"""


@pytest.mark.slow  # trains a model (~15-45 s on 2 cores)
def test_a_nanochat_candidate_spreading_over_every_core_gets_one(tmp_path) -> None:
    from evolve.benchmarks.nanochat import prepare

    data = tmp_path / "data"
    stdlib = Path(os.__file__).parent
    from evolve.benchmarks.nanochat.sources import chunk_text

    texts = [
        c for n in ("argparse.py", "textwrap.py") for c in chunk_text((stdlib / n).read_text())
    ]
    val = list(chunk_text((stdlib / "string.py").read_text()))
    prepare.build(
        data / "tiny", train=lambda: texts, val=lambda: val * 4, vocab_size=512, log=lambda _: None
    )
    files = programs.seed_files()
    anchor = "torch.manual_seed(settings.seed)\n"
    files["train.py"] = files["train.py"].replace(anchor, anchor + GREEDY_TRAINING)
    work = programs.write(files, tmp_path / "work")
    evaluation = evaluate_safely(tiny_fitness(data), work, EvalContext(seed=0, scratch=tmp_path))
    assert evaluation.ok, dict(evaluation.artifacts)
    line = next(x for x in evaluation.artifacts["train_log"].splitlines() if x.startswith("GREEDY"))
    assert line.startswith(f"GREEDY ['{MACHINE[0]}'] "), line


CUDA = """
import os, json, torch, torch.distributed as dist
dist.init_process_group("nccl", init_method=f"file://{os.getcwd()}/store", rank=0, world_size=1)
x = torch.ones(1024, 1024, device="cuda")
dist.all_reduce(x)
y = (x @ x).sum().item()
dist.destroy_process_group()
print(json.dumps({"seen": sorted(os.sched_getaffinity(0)), "ok": y == 1024.0 ** 3}))
"""


@pytest.mark.gpu  # NCCL pins its threads near the GPU: it must start under a held allowance
def test_cuda_and_nccl_start_on_one_core(mode, tmp_path) -> None:
    if not pytest.importorskip("torch").cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    result = sandbox.run(
        [sys.executable, "-c", CUDA],
        cwd=tmp_path,
        limits=sandbox.Limits(cores=1, timeout_s=300, memory_bytes=None),
    )
    assert result.ok, result.tail()
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"seen": [MACHINE[0]], "ok": True}
    assert not result.isolation["cpu"].startswith(NOT), result.isolation["cpu"]
