"""CPU allowances: disjoint cores per slot, a command held to its cores, thread hints that follow."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from evolve.sandbox import cores, isolation
from evolve.sandbox import process as sandbox
from evolve.sandbox.channels import NOT

MACHINE = tuple(sorted(os.sched_getaffinity(0)))
needs_two = pytest.mark.skipif(len(MACHINE) < 2, reason="needs two cores to give one")
SHOW = (
    "import os; print(sorted(os.sched_getaffinity(0)), *(os.environ.get(v) for v in"
    " ('OMP_NUM_THREADS', 'MKL_NUM_THREADS', 'TORCHINDUCTOR_COMPILE_THREADS')))"
)




def test_slots_get_disjoint_runs_of_cores_as_even_as_they_go() -> None:
    assert cores.split(2, range(4)) == [(0, 1), (2, 3)]
    assert cores.split(3, range(8)) == [(0, 1, 2), (3, 4, 5), (6, 7)]
    assert cores.split(1, [3, 1]) == [(1, 3)]


def test_more_slots_than_cores_share_cores_round_robin() -> None:
    assert cores.split(5, [0, 1]) == [(0,), (1,), (0,), (1,), (0,)]
    with pytest.raises(ValueError, match="at least one"):
        cores.split(0, [0, 1])


def test_core_lists_read_and_write_the_kernel_format() -> None:
    assert cores.parse_list("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert cores.format_list([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert cores.format_list([5]) == "5"


def test_an_allowance_of_no_cores_names_the_fix() -> None:
    with pytest.raises(ValueError, match="at least 1 core, or None"):
        cores.plan(0)


@needs_two
def test_a_command_runs_on_its_cores_with_thread_hints_that_follow(mode, tmp_path) -> None:
    result = sandbox.run([sys.executable, "-c", SHOW], cwd=tmp_path, limits=sandbox.Limits(cores=1))
    assert result.ok, result.stderr
    assert result.stdout.split() == [f"[{MACHINE[0]}]", "1", "1", "1"]
    cpu = result.isolation["cpu"]
    assert not cpu.startswith(NOT) and f"1 core(s) ({MACHINE[0]})" in cpu
    assert ("cpuset cgroup" in cpu) == (mode == "cgroup")


def test_the_callers_thread_count_wins_and_all_cores_by_default(mode, tmp_path) -> None:
    result = sandbox.run([sys.executable, "-c", SHOW], cwd=tmp_path, env={"OMP_NUM_THREADS": "7"})
    assert result.ok, result.stderr
    # MKL follows the caller's OpenMP threads; torch's compile workers, the allowance
    assert result.stdout.strip() == f"{list(MACHINE)} 7 7 {len(MACHINE)}"


def test_asking_for_more_cores_than_the_caller_has_gives_all_and_says_so(tmp_path) -> None:
    result = sandbox.run(
        [sys.executable, "-c", SHOW], cwd=tmp_path, limits=sandbox.Limits(cores=len(MACHINE) + 1)
    )
    assert result.ok, result.stderr
    assert f"{len(MACHINE) + 1} asked" in result.isolation["cpu"]


def test_the_allowance_is_not_held_as_root_where_it_could_leave_its_cgroup(tmp_path) -> None:
    v1 = cores.Allowance(cores=(0,), asked=1, online=(0, 1), cgroup=str(tmp_path / "v1"))
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "cgroup.controllers").write_text("cpuset cpu\n")
    v2 = cores.Allowance(cores=(0,), asked=1, online=(0, 1), cgroup=str(tmp_path / "v2"))
    confined = {"writes": "confined to the workdir and 3 more path(s)"}
    loose = {"writes": f"{NOT}confined: Landlock unavailable"}
    for allowance in (v1, v2):
        value = f"1 core(s) (0) held by the cpuset cgroup {allowance.cgroup}"
        verdicts = [cores.held(allowance, value, r) for r in (confined, loose, {})]
        if os.geteuid() != 0:  # the cgroup files are root's: another uid cannot leave
            assert verdicts == [value] * 3
            continue
        assert verdicts[0] == value if allowance is v1 else "clone3" in verdicts[0]
        assert all(v.startswith(f"{NOT}held") for v in verdicts[allowance is v1 :])


def test_the_report_of_this_machine_has_a_cpu_key(tmp_path: Path) -> None:
    assert "cpu" in sandbox.isolation_report()


@needs_two
def test_a_strict_policy_refuses_to_run_where_no_allowance_can_be_held(
    monkeypatch, tmp_path
) -> None:
    monkeypatch.setattr(cores, "CGROUP_MOUNTS", ())  # no cgroup, and no seccomp on this "machine"
    monkeypatch.setattr(cores, "SCHED_SETAFFINITY", {})
    loose = sandbox.run(["true"], cwd=tmp_path, limits=sandbox.Limits(cores=1))
    assert loose.isolation["cpu"].startswith(f"{NOT}held"), loose.isolation["cpu"]
    if set(isolation.gaps(loose.isolation)) != {"cpu"}:
        pytest.skip(f"other gaps here: {isolation.gaps(loose.isolation)}")
    with pytest.raises(sandbox.IsolationError):
        sandbox.run(
            ["true"],
            cwd=tmp_path,
            limits=sandbox.Limits(cores=1),
            policy=sandbox.Policy(strict=True),
        )


@needs_two
def test_a_process_started_within_inherited_runs_on_its_cores() -> None:
    program = (
        "import os, threading, time\n"
        "threading.Thread(target=time.sleep, args=(2,), daemon=True).start()\n"
        "print(sorted({str(os.sched_getaffinity(int(t))) for t in os.listdir('/proc/self/task')}))"
    )
    with cores.inherited([MACHINE[-1]]):
        out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert out.stdout.strip() == str([str({MACHINE[-1]})]), out.stderr
    assert tuple(sorted(os.sched_getaffinity(0))) == MACHINE
