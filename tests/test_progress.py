"""What a run shows while a long evaluation goes: a line per phase it enters, from its worker."""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from evolve.backends.local import LocalBackend, Watch
from evolve.fitness import EvalContext
from evolve.harness import phases
from evolve.types import Descriptor, EvalStatus, Evaluation, Job, Objective
from tests.conftest import REPO


class Phased:
    """Goes through the phases ``alpha`` and ``beta``, then scores 1."""

    objective = Objective(name="score")
    descriptors = (Descriptor(name="x", low=0, high=1, bins=1),)

    def evaluate(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        for phase in ("alpha", "beta"):
            phases.mark(phase)
            time.sleep(0.2)
        return Evaluation(status=EvalStatus.OK, fitness=1.0, descriptors={"x": 0.5})


def test_a_long_evaluations_phases_are_logged_as_they_begin(monkeypatch, caplog):
    monkeypatch.setattr(Watch, "QUIET_S", 0.0)  # every evaluation counts as long here
    monkeypatch.setattr(Watch, "SETTLE_S", 0.0)
    backend = LocalBackend(fitness=Phased(), workers=1)
    try:
        with caplog.at_level(logging.INFO, logger="evolve"):
            job = Job(candidate_id="c0ffee" * 4, files={}, seed=0, timeout_s=60)
            assert asyncio.run(backend.evaluate(0, job)).fitness == 1.0
    finally:
        backend.close()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("evaluating c0ffeec0")]
    named = [re.match(r"evaluating c0ffeec0: (.+) \(\d+ s in\)$", line)[1] for line in said]
    assert named.index("alpha") < named.index("beta"), said


def test_nanochat_on_the_cpu_says_what_it_does_within_15_s_of_an_evaluations_start(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "HYDRA_FULL_ERROR": "0"}
    args = ["benchmark=nanochat", "search.max_candidates=1", "search.progress=false", f"hydra.run.dir={tmp_path}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "evolve", *args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if re.search(r"evaluating \w{8}: (local_check|sandbox_start) ", line):
                break
    finally:
        proc.terminate()
        proc.communicate(timeout=120)

    def when(pattern: str) -> datetime.datetime:
        line = next(x for x in lines if re.search(pattern, x))
        return datetime.datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f")

    shown = "".join(lines[-20:])
    started = when(r"evaluating the seed program")
    assert (when(r"evaluating \w{8}: ") - started).total_seconds() <= 15, shown
    assert re.search(r"evaluating \w{8}: (local_check|sandbox_start) \(\d+ s in\)", shown), shown
