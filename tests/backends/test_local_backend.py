"""The local backend's slots: a discarded worker takes its candidate's processes and folders along."""

import asyncio
import json
import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from evolve.backends import LocalBackend, local
from evolve.harness import gpus
from evolve.types import EvalStatus, Job
from tests.backends.fitnesses import CoreReport, Outlasting


def tagged(tag: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if tag in line]


def test_a_worker_killed_at_its_deadline_leaves_no_candidate_process_or_folder(monkeypatch):
    monkeypatch.setattr(local, "HARNESS_GRACE_S", 1.0)
    tag = f"outlasting-{uuid.uuid4().hex}"
    backend = LocalBackend(fitness=Outlasting(tag), workers=1)
    candidate = uuid.uuid4().hex[:20]
    try:
        job = Job(candidate_id=candidate, files={"main.py": "pass\n"}, seed=0, timeout_s=4)
        evaluation = asyncio.run(backend.evaluate(0, job))
        assert evaluation.status == EvalStatus.TIMEOUT
        deadline = time.monotonic() + 10
        while tagged(tag) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert tagged(tag) == []
        assert list(Path(tempfile.gettempdir()).glob(f"evolve-{candidate[:8]}-*")) == []
    finally:
        backend.close()


def test_each_slot_sees_only_its_gpus_from_the_first_import(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setattr(gpus, "visible_gpus", lambda: ["0", "1"])
    backend = LocalBackend(fitness=Outlasting("report"), gpus_per_eval=1)
    try:
        seen = [
            json.loads(asyncio.run(backend.evaluate(slot, Job(candidate_id=f"{slot}" * 20, files={}, seed=0, timeout_s=30))).artifacts["seen"])
            for slot in range(backend.slots)
        ]
    finally:
        backend.close()
    assert seen == [{"at_import": "0", "at_eval": "0"}, {"at_import": "1", "at_eval": "1"}]




@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores for two slots")
def test_two_slots_run_on_disjoint_cores_and_their_commands_too():
    backend = LocalBackend(fitness=CoreReport(), workers=2)
    try:
        jobs = [Job(candidate_id=f"{s}" * 20, files={}, seed=0, timeout_s=60) for s in range(2)]
        done = [asyncio.run(backend.evaluate(slot, job)) for slot, job in enumerate(jobs)]
        seen = [json.loads(evaluation.artifacts["seen"]) for evaluation in done]
    finally:
        backend.close()
    own = [list(c) for c in backend.cores]
    assert not set(own[0]) & set(own[1])
    assert seen == [
        {"worker": own[0], "command": f"{own[0]} {len(own[0])}"},
        {"worker": own[1], "command": f"{own[1]} {len(own[1])}"},
    ]


def test_more_slots_than_cores_share_them_and_say_so(caplog):
    cores = len(os.sched_getaffinity(0))
    backend = LocalBackend(fitness=CoreReport(), workers=cores + 1)
    try:
        assert len(set(backend.cores)) == cores
        assert f"{cores + 1} evaluation slots on {cores} CPU cores" in caplog.text
    finally:
        backend.close()
