"""The auditor stage in a run: a new best is audited; a flagged one is re-evaluated strictly before promotion.

Runs go through the real engine, driver and local backend (worker processes) with a scripted
operator whose children are fixed programs: a clean improvement, then an improvement that
adds ``import ctypes``, then a change that is no new best. The fitness is the toy fitness;
its strict variant scores lower whenever ``EvalContext.strict`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from evolve.archive import noise
from evolve.archive.grid import Archive
from evolve.archive.referee import INFRASTRUCTURE_RETRIES, ModelReview, ReviewDiff
from evolve.backends import LocalBackend
from evolve.browse.cli import main as browse
from evolve.harness.fitness import Benchmark, EvalContext
from evolve.launch.config import ConfigError, audit_settings
from evolve.llm import LLMClient, LLMSettings
from evolve.operators.base import OperatorRequest
from evolve.research.review import Reviewer
from evolve.search.driver import Driver
from evolve.search.emitters import Emitter
from evolve.search.engine import Engine
from evolve.search.jobs import eval_seed
from evolve.settings import AuditSettings, SearchSettings
from evolve.store.database import Store
from evolve.types import CandidateStatus, EdgeRole, EvalStatus, Evaluation, Proposal
from tests.fixtures.toy import Toy

SEED = "import math\n# EVOLVE-BLOCK-START\nA = 1.0\nB = 4\nC = 0.5\n# EVOLVE-BLOCK-END\n"
CLEAN = SEED.replace("B = 4", "B = 8")  # score -20.0625: a new best, nothing suspicious
FLAGGED = SEED.replace("A = 1.0", "import ctypes\nA = 1.0").replace("B = 4", "B = 12")  # -4.0625
WORSE = SEED.replace("B = 4", "B = 5")  # -53.0625: improves its cell, not the run's best
CHILDREN = {1: CLEAN, 2: FLAGGED, 3: WORSE}


class StrictAware(Toy):
    """The toy fitness; reports whether it ran in strict mode and scores ``penalty`` lower there."""

    def __init__(self, *, penalty: float = 0.0) -> None:
        super().__init__()
        self.penalty = penalty

    def evaluate(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        result = super().evaluate(workdir, ctx)
        if not result.ok:
            return result
        shift = self.penalty if ctx.strict else 0.0
        metrics = {**result.metrics, "strict_mode": float(ctx.strict)}
        return Evaluation(
            status=result.status,
            fitness=result.fitness - shift,
            metrics=metrics,
            descriptors=result.descriptors,
        )


class WallLimited(StrictAware):
    """The toy fitness, whose strict evaluations the wall clock stops ``stops`` times first (a
    loaded machine: the program's own budget is never reached); counted in ``tally``."""

    def __init__(self, *, tally: Path, stops: int) -> None:
        super().__init__()
        self.tally, self.stops = tally, stops

    def evaluate(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        if ctx.strict:
            seen = len(self.tally.read_text()) if self.tally.exists() else 0
            self.tally.write_text("x" * (seen + 1))
            if seen < self.stops:
                return Evaluation(
                    status=EvalStatus.TIMEOUT,
                    artifacts={"error": "wall limit 60 s reached", "limit": "wall"},
                )
        return super().evaluate(workdir, ctx)


class Scripted:
    """An operator whose child number ``seq`` is the fixed program ``CHILDREN[seq]``."""

    name = "scripted"
    arity = 1

    async def propose(self, request: OperatorRequest) -> Proposal:
        parent = request.parents[0].candidate
        return Proposal(
            files={"params.py": CHILDREN[request.seq]},
            parents=((parent.id, EdgeRole.MUTATION),),
            operator=self.name,
            description=f"scripted child {request.seq}",
        )


TASK = "Choose A, B and C to maximise the score. Rules: no native code, no shared memory."


def search(
    tmp_path: Path,
    *,
    penalty: float = 0.0,
    audit: AuditSettings | None = None,
    llm: LLMSettings | None = None,
    review_diff: ReviewDiff | None = None,
    proposals_in_flight: int | None = None,
    fitness: StrictAware | None = None,
) -> Store:
    """A run of the seed and the three scripted children on one evaluation slot; returns its
    store (open).

    ``llm``: the run's model reviews each audited change (``evolve.research.review``);
    ``review_diff``: this function does instead.
    """
    seed_dir = tmp_path / "seed"
    seed_dir.mkdir(parents=True)
    (seed_dir / "params.py").write_text(SEED)
    fitness = fitness or StrictAware(penalty=penalty)
    benchmark = Benchmark(
        name="toy", fitness=fitness, seed_dir=seed_dir, editable=("params.py",), task=TASK
    )
    store = Store(tmp_path / "archive.db")
    archive = Archive(store=store, objective=fitness.objective, descriptors=fitness.descriptors)
    emitter = Emitter(archive=archive, operators=[(Scripted(), 1.0)])
    engine = Engine(store=store, archive=archive, emitter=emitter, benchmark=benchmark)
    backend = LocalBackend(fitness=fitness, workers=1)
    client = None if llm is None else LLMClient(llm, store=store)
    reviewer = review_diff if client is None else Reviewer(client, llm.models[0][0], benchmark)

    async def run() -> None:
        try:
            await driver.run()
        finally:
            if client is not None:
                await client.close()

    try:
        settings = SearchSettings(
            max_candidates=4, progress=False, max_proposals_in_flight=proposals_in_flight
        )
        driver = Driver(
            engine=engine, backend=backend, settings=settings, audit=audit, review_diff=reviewer
        )
        asyncio.run(run())
    finally:
        backend.close()
    assert store.integrity_problems() == []
    return store


def by_seq(store: Store, seq: int) -> str:
    return store.conn.execute("SELECT id FROM candidates WHERE seq=?", (seq,)).fetchone()[0]


def audits(store: Store) -> dict[int, tuple]:
    rows = store.conn.execute(
        "SELECT c.seq, a.flagged, a.decision, a.flags, a.strict_fitness, a.reason FROM audits a "
        "JOIN candidates c ON c.id = a.candidate"
    )
    return {
        seq: (bool(flagged), decision, json.loads(flags), strict, reason)
        for seq, flagged, decision, flags, strict, reason in rows
    }


def stages(store: Store, seq: int) -> list[tuple]:
    return store.conn.execute(
        "SELECT stage, status, fitness, seeds, metrics FROM evaluations WHERE candidate=? ORDER BY id",
        (by_seq(store, seq),),
    ).fetchall()


def test_a_flagged_new_best_is_promoted_when_its_strict_evaluation_confirms(tmp_path) -> None:
    store = search(tmp_path)
    verdicts = audits(store)
    assert set(verdicts) == {1, 2}  # the seed and the child that is no new best are not audited
    flagged, decision, flags, strict_fitness, reason = verdicts[2]
    assert flagged and decision == "promoted" and reason == ""
    assert [(f["path"], f["line"], f["rule"], f["code"]) for f in flags] == [
        ("params.py", 3, "native-code", "import ctypes")
    ]
    assert strict_fitness == pytest.approx(-4.0625)
    rows = stages(store, 2)
    assert [(stage, status) for stage, status, *_ in rows] == [("strict", "ok"), ("full", "ok")]
    strict_seeds, first_seeds = json.loads(rows[0][3]), json.loads(rows[1][3])
    base = eval_seed(0, 2)
    assert first_seeds == [base] and strict_seeds == [noise.reevaluation_seed(base, 1)]
    assert json.loads(rows[0][4])["strict_mode"] == 1.0  # the fitness ran in strict mode
    assert json.loads(rows[1][4])["strict_mode"] == 0.0
    assert store.candidate(by_seq(store, 2)).status == CandidateStatus.DONE
    best = store.conn.execute(
        "SELECT candidate, objective FROM elites ORDER BY objective DESC"
    ).fetchone()
    assert best == (by_seq(store, 2), pytest.approx(-4.0625))


def test_a_clean_new_best_is_audited_and_promoted_without_an_extra_evaluation(tmp_path) -> None:
    store = search(tmp_path)
    flagged, decision, flags, strict_fitness, _ = audits(store)[1]
    assert (flagged, decision, flags, strict_fitness) == (False, "clean", [], None)
    assert [(stage, status) for stage, status, *_ in stages(store, 1)] == [("full", "ok")]
    assert [(stage, status) for stage, status, *_ in stages(store, 3)] == [("full", "ok")]


def test_a_flagged_new_best_is_refused_when_its_strict_evaluation_does_not_confirm(
    tmp_path,
) -> None:
    store = search(tmp_path, penalty=100.0)
    flagged, decision, flags, strict_fitness, reason = audits(store)[2]
    assert flagged and decision == "refused" and strict_fitness == pytest.approx(-104.0625)
    assert reason.startswith(
        "auditor: flagged, then refused; flags: native-code at params.py:3; strict "
        "re-evaluation: strict fitness -104.062 does not beat the best -20.0625"
    )
    rows = stages(store, 2)
    assert [(stage, status) for stage, status, *_ in rows] == [
        ("strict", "ok"),
        ("full", "rejected"),
    ]
    refused = store.evaluation(by_seq(store, 2))
    assert refused.fitness == pytest.approx(-4.0625)  # its first score stays, beside the decision
    # what prompts show of it: the decision, never the flag (a rule could be one the task prescribes)
    assert refused.artifacts["error"] == "auditor: flagged, then refused"
    assert refused.artifacts["audit"] == reason
    assert store.candidate(by_seq(store, 2)).status == CandidateStatus.FAILED
    elites = {cid for _, _, cid, _ in store.elites()}
    assert by_seq(store, 2) not in elites and by_seq(store, 1) in elites
    best = store.conn.execute("SELECT candidate FROM elites ORDER BY objective DESC").fetchone()[0]
    assert best == by_seq(store, 1)  # a clean child stays the best (the penalty is strict-only)


def test_with_the_auditor_off_a_flagged_new_best_is_promoted_unaudited(tmp_path) -> None:
    store = search(tmp_path, penalty=100.0, audit=AuditSettings(enabled=False))
    assert audits(store) == {}
    assert [(stage, status) for stage, status, *_ in stages(store, 2)] == [("full", "ok")]
    best = store.conn.execute("SELECT candidate FROM elites ORDER BY objective DESC").fetchone()[0]
    assert best == by_seq(store, 2)


def test_browse_shows_the_verdict_and_marks_audited_elites(tmp_path) -> None:
    store = search(tmp_path)
    flagged_id = by_seq(store, 2)
    store.close()
    runner = CliRunner()
    shown = runner.invoke(browse, [str(tmp_path), "show", flagged_id, "--json"])
    assert shown.exit_code == 0, shown.output
    verdict = json.loads(shown.output)["audit"]
    assert verdict["flagged"] and verdict["decision"] == "promoted"
    assert [(f["path"], f["line"], f["rule"]) for f in verdict["flags"]] == [
        ("params.py", 3, "native-code")
    ]
    assert "ctypes" in verdict["flags"][0]["reason"]
    text = runner.invoke(browse, [str(tmp_path), "show", flagged_id])
    assert text.exit_code == 0 and "params.py:3 [native-code] imports ctypes" in text.output
    assert "verdict: flagged, promoted" in text.output
    seed_shown = json.loads(runner.invoke(browse, [str(tmp_path), "show", "#0", "--json"]).output)
    assert seed_shown["audit"] is None
    rows = json.loads(runner.invoke(browse, [str(tmp_path), "best", "--json"]).output)
    marks = {row["seq"]: row["audit"] for row in rows}
    assert marks == {2: "flagged, promoted", 3: None}  # #3 took the seed's cell, unaudited
    table = runner.invoke(browse, [str(tmp_path), "best"])
    assert table.exit_code == 0 and " flagged " in table.output


def test_audit_settings_are_checked() -> None:
    assert audit_settings({}) == AuditSettings(enabled=True, strict_seeds=1, review=True)
    with pytest.raises(ConfigError, match="audit.strict_seeds must be an integer >= 1"):
        audit_settings({"audit": {"strict_seeds": 0}})
    with pytest.raises(ConfigError, match="audit.enabled must be true or false"):
        audit_settings({"audit": {"enabled": "yes"}})
    with pytest.raises(ConfigError, match="audit.review must be true or false"):
        audit_settings({"audit": {"review": 1}})
    with pytest.raises(ConfigError, match="unknown key"):
        audit_settings({"audit": {"level": 3}})


def test_the_web_pages_show_the_verdict(tmp_path) -> None:
    from evolve.browse.web.server import make_app

    store = search(tmp_path)
    flagged_id, clean_id = by_seq(store, 2), by_seq(store, 1)
    store.close()
    app = make_app(tmp_path / "archive.db")
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(app.invoke_startup())

        def get(path: str) -> str:
            response = loop.run_until_complete(app.client.get(path))
            assert response.status_code == 200, path
            return response.text

        page = get(f"/-/evolve/c/{flagged_id}")
        assert "flagged, promoted" in page and "params.py:3" in page and "native-code" in page
        assert "import ctypes" in page and "strict re-evaluation fitness -4.0625" in page
        assert "<strong>clean</strong>" in get(f"/-/evolve/c/{clean_id}")
        assert "audit: flagged, promoted" in get("/-/evolve/elites")
    finally:
        loop.close()


def test_a_model_review_holds_no_evaluation_slot(tmp_path) -> None:
    """On one slot, the next candidate is evaluated while a would-be best's review waits on its model."""
    evaluated_during_review: list[int] = []

    def evaluated(seq: int) -> bool:
        with contextlib.closing(sqlite3.connect(tmp_path / "archive.db")) as db:
            query = "SELECT 1 FROM evaluations e JOIN candidates c ON c.id = e.candidate WHERE c.seq = ?"
            return db.execute(query, (seq,)).fetchone() is not None

    async def slow_review(candidate, parent_files, report, score, best) -> ModelReview:
        if candidate.seq == 1:  # waits as a slow model would, until child 2 has been evaluated
            deadline = time.monotonic() + 120  # bounds only a failing run: the slot is never free
            while not evaluated(2) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            evaluated_during_review.extend([2] if evaluated(2) else [])
        return ModelReview(verdict="clean", reasons="fine", model="slow", prompt_hash="h")

    store = search(tmp_path, review_diff=slow_review, proposals_in_flight=2)
    assert evaluated_during_review == [2], "child 2 waited for child 1's review to end"
    verdicts = audits(store)
    # child 3 is asked while child 1 is under review (an audit holds no place in the window);
    # told before child 1 it beats the run's best, the seed, and is audited too (clean)
    assert {1, 2} <= set(verdicts) <= {1, 2, 3} and verdicts[1][1] == "clean"
    assert verdicts.get(3, (False, "clean"))[1] == "clean"
    assert verdicts[2][1] == "promoted"  # flagged (import ctypes): its strict run borrowed the slot
    assert [stage for stage, *_ in stages(store, 2)] == ["strict", "full"]


def test_a_strict_evaluation_the_wall_clock_stopped_is_run_again_not_refused(tmp_path) -> None:
    """A loaded machine stops the strict re-run before the program's budget: it is a retry."""
    tally = tmp_path / "strict_runs"
    store = search(tmp_path, fitness=WallLimited(tally=tally, stops=1))
    flagged, decision, _, strict_fitness, reason = audits(store)[2]
    assert flagged and decision == "promoted" and reason == ""
    assert strict_fitness == pytest.approx(-4.0625) and len(tally.read_text()) == 2
    assert store.candidate(by_seq(store, 2)).status == CandidateStatus.DONE


def test_a_strict_evaluation_the_wall_clock_always_stops_is_unconfirmed_not_refused(
    tmp_path,
) -> None:
    tally = tmp_path / "strict_runs"
    store = search(tmp_path, fitness=WallLimited(tally=tally, stops=99))
    flagged, decision, _, strict_fitness, reason = audits(store)[2]
    assert flagged and decision == "unconfirmed" and strict_fitness is None
    assert len(tally.read_text()) == INFRASTRUCTURE_RETRIES + 1
    kept = store.evaluation(by_seq(store, 2))
    assert kept.fitness == pytest.approx(-4.0625)  # its first score is stored
    assert kept.artifacts["error"].startswith("auditor: flagged, then unconfirmed (the wall clock")
    assert "not held against the program" in kept.artifacts["error"] and "ctypes" not in reason
    best = store.conn.execute("SELECT candidate FROM elites ORDER BY objective DESC").fetchone()[0]
    assert best == by_seq(store, 1)  # not promoted unconfirmed
