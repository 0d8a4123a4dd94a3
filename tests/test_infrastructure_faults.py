"""Infrastructure faults are never a candidate's failure: a temp dir that cannot be used or a
full disk ends the run with one error naming the cause, and the candidate is evaluated at
resume; a fitness returning something other than an Evaluation fails naming what it returned."""

from __future__ import annotations

import tempfile

import pytest

from evolve.backends.base import run_job
from evolve.launch import runner
from evolve.store.database import Store
from evolve.types import CandidateStatus, InfrastructureFault, Job
from tests.conftest import composed
from tests.fixtures.toy import Toy

RUN = ["search.max_candidates=6", "search.workers=1"]


def statuses(run_dir) -> dict[str, int]:
    store = Store(run_dir / "archive.db", readonly=True)
    try:
        return {str(k): v for k, v in store.status_counts().items()}
    finally:
        store.close()


def test_a_temp_dir_that_cannot_be_used_is_the_machines_fault_not_the_candidates(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "gone"))  # removed under the run
    job = Job(
        candidate_id="c" * 20, files={"params.py": "A = 1.0\nB = 4\nC = 0.5\n"}, seed=0, timeout_s=5
    )
    with pytest.raises(
        InfrastructureFault, match=r"cannot prepare an evaluation's folders in .*gone"
    ):
        run_job(Toy(), job, None)


def test_a_full_disk_under_the_fitness_ends_the_run_and_fails_no_candidate(tmp_path) -> None:
    flag, run_dir = tmp_path / "full", tmp_path / "run"
    flag.write_text("full")
    cfg = composed(RUN)
    cfg["benchmark"]["fitness"] = {"_target_": "tests.fixtures.toy.DiskFull", "flag": str(flag)}
    with pytest.raises(InfrastructureFault, match="No space left on device"):
        runner.run(cfg, run_dir)
    assert statuses(run_dir).get(str(CandidateStatus.FAILED), 0) == 0
    flag.unlink()
    runner.run(cfg, run_dir, resumed=True)
    assert statuses(run_dir).get(str(CandidateStatus.DONE), 0) >= 1


@pytest.mark.parametrize("value", [None, {"score": 1.0}], ids=["None", "dict"])
def test_a_fitness_returning_no_evaluation_fails_the_candidate_naming_what_it_returned(
    tmp_path, value
) -> None:
    cfg = composed(RUN)
    cfg["benchmark"]["fitness"] = {"_target_": "tests.fixtures.toy.Returns", "value": value}
    runner.run(cfg, tmp_path)
    store = Store(tmp_path / "archive.db", readonly=True)
    errors = [
        row[0]
        for row in store.conn.execute(
            "SELECT json_extract(artifacts, '$.error') FROM evaluations WHERE status='error'"
        )
    ]
    store.close()
    assert errors and all(
        f"returned a {type(value).__name__}" in e and "not an Evaluation" in e for e in errors
    )
