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
from evolve.harness import phases, protocol
from evolve.harness.fitness import EvalContext
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


class Training:
    """Enters ``training`` and tells a step's detail, then stays there until ``seen`` exists
    (at most a minute); then ``scoring``; scores 1."""

    objective = Objective(name="score")
    descriptors = (Descriptor(name="x", low=0, high=1, bins=1),)

    def __init__(self, seen: Path) -> None:
        self.seen = seen

    def evaluate(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        phases.mark("training")
        phases.detail("step 3, loss 3.70")
        deadline = time.monotonic() + 60
        while not self.seen.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        phases.mark("scoring")
        return Evaluation(status=EvalStatus.OK, fitness=1.0, descriptors={"x": 0.5})


class Seen(logging.Handler):
    """Creates ``path`` once a log line matches ``pattern``."""

    def __init__(self, pattern: str, path: Path) -> None:
        super().__init__()
        self.pattern, self.path = pattern, path

    def emit(self, record: logging.LogRecord) -> None:
        if re.search(self.pattern, record.getMessage()):
            self.path.touch()


def test_a_detail_from_the_worker_rides_on_the_phases_regular_line(monkeypatch, caplog, tmp_path):
    monkeypatch.setattr(Watch, "QUIET_S", 0.0)
    monkeypatch.setattr(Watch, "EVERY_S", 0.2)
    pattern = r"^evaluating deed00de: training: step 3, loss 3\.70 \(\d+ s in\)$"
    seen = Seen(pattern, tmp_path / "seen")
    logging.getLogger("evolve").addHandler(seen)
    backend = LocalBackend(fitness=Training(tmp_path / "seen"), workers=1)
    try:
        with caplog.at_level(logging.INFO, logger="evolve"):
            job = Job(candidate_id="deed00" * 4, files={}, seed=0, timeout_s=120)
            assert asyncio.run(backend.evaluate(0, job)).fitness == 1.0
    finally:
        backend.close()
        logging.getLogger("evolve").removeHandler(seen)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("evaluating")]
    assert any(re.search(pattern, x) for x in said), said


def test_a_regular_line_says_the_phase_with_its_latest_detail(caplog):
    watch = Watch("feed" * 8)
    watch.heard("training")
    watch.heard("training", "step 2, loss 3.80")
    watch.heard("training", "step 3, loss 3.70")
    with caplog.at_level(logging.INFO, logger="evolve"):
        watch.say()
        watch.heard("scoring")  # a new phase: the detail was the last one's
        watch.say()
    lines = [r.getMessage() for r in caplog.records]
    assert re.fullmatch(r"evaluating feedfeed: training: step 3, loss 3.70 \(\d+ s in\)", lines[0]), lines
    assert re.fullmatch(r"evaluating feedfeed: scoring \(\d+ s in\)", lines[1]), lines


def test_a_progress_line_tells_only_numbers_formatted_by_the_harness():
    assert protocol.progress_detail('{"progress": {"step": 120, "loss": 3.4149}}') == "step 120, loss 3.41"
    assert protocol.progress_detail('{"progress": {"step": 7, "loss": null}}') == "step 7"
    for line in (
        '{"progress": {"step": "120 \\u001b[2J pwned", "loss": 1}}',
        '{"progress": {"step": true}}',
        '{"progress": {"step": -1}}',
        '{"progress": "step 3"}',
        '{"nonce": "x", "status": "ok"}',
        "step 3, loss 1.0",
        "{not json",
    ):
        assert protocol.progress_detail(line) is None, line
    assert protocol.progress_detail('{"progress": {"step": 3, "loss": "3.41; rm -rf"}}') == "step 3"
    assert protocol.progress_detail('{"progress": {"step": 3, "loss": NaN}}') == "step 3"


def nanochat_lines_until(tmp_path: Path, stop: str) -> list[str]:
    """The lines of a one-candidate nanochat search on the CPU, until one matches ``stop``."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HYDRA_FULL_ERROR": "0"}
    args = ["benchmark=nanochat", "search.max_candidates=1", "search.progress=false", f"hydra.run.dir={tmp_path}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "evolve", *args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if re.search(stop, line):
                break
    finally:
        proc.terminate()
        proc.communicate(timeout=120)
    return lines


def test_nanochat_on_the_cpu_says_what_it_does_within_15_s_of_an_evaluations_start(tmp_path):
    lines = nanochat_lines_until(tmp_path, r"evaluating \w{8}: (local_check|sandbox_start) ")

    def when(pattern: str) -> datetime.datetime:
        line = next(x for x in lines if re.search(pattern, x))
        return datetime.datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f")

    shown = "".join(lines[-20:])
    started = when(r"evaluating the seed program")
    assert (when(r"evaluating \w{8}: ") - started).total_seconds() <= 15, shown
    assert re.search(r"evaluating \w{8}: (local_check|sandbox_start) \(\d+ s in\)", shown), shown


def test_nanochat_on_the_cpu_says_its_training_step_while_it_trains(tmp_path):
    lines = nanochat_lines_until(tmp_path, r"evaluating \w{8}: training: step |evaluated")
    shown = "".join(lines[-20:])
    assert re.search(r"evaluating \w{8}: training: step \d+(, loss \d+\.\d\d)? \(\d+ s in\)", shown), shown
