"""Drives the engine: many proposals (LLM calls) in flight, every evaluation slot fed, budgets kept.

A proposal starts (its parents chosen from the archive as it is then) while fewer than
``search.max_proposals_in_flight`` are running and fewer than ``in flight + slots +
search.lookahead - 1`` are running, waiting for a slot or holding one: a candidate whose
evaluation is over no longer counts while the auditor reviews it (a model's review, a
strict re-run), so no slot idles behind an audit, and ``search.lookahead`` (the user's
bound) lets more LLM calls run ahead while every slot is busy. Each admitted candidate borrows the next free evaluation slot (``evolve.search.slots``)
for its evaluation and the referee's extra samples, and gives it back before the auditor's
model review: no slot waits on a model. Every start, admission and result happens in one
synchronous step of the event loop and is numbered by the engine, so:

- with one proposal in flight and one slot, everything happens one at a time (but the next
  proposal while a would-be best is audited) and a run without a would-be best's model
  review is a pure function of its seed, interrupted and resumed or not;
- with more, the numbered order is stored (the ``schedule`` table) and an offline replay of
  the run (``llm.offline`` + ``llm.replay_from``) follows it event by event, so it makes the
  same candidates whatever its own timing.

Proposals in flight when a run is killed were stored as asks without a candidate; a resume
asks them again with the same prompt, so a recorded answer is reused, not paid again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from evolve.archive import noise
from evolve.archive.referee import AuditVerdict, ReviewDiff
from evolve.backends import Backend
from evolve.search.emitters import Ask
from evolve.search.engine import Engine, Outcome
from evolve.search.progress import Progress, evaluation_line
from evolve.search.rejections import Rejection, Streak
from evolve.search.slots import Slots
from evolve.settings import AuditSettings, SearchSettings
from evolve.types import Candidate, Evaluation

log = logging.getLogger("evolve")


@dataclass(frozen=True)
class Summary:
    """How a run ended."""

    reason: str
    evaluated: int
    failures: int
    best_id: str | None
    best: float | None
    seed_fitness: float | None


class Driver:
    """Runs an engine to its budget on a backend (see the module docstring).

    Args:
        engine: the ask/tell core of the run.
        backend: evaluates candidates, ``slots`` at once.
        settings: budgets and concurrency.
        noise: noise-aware selection (``evolve.archive.referee``); None or ``seeds: 1`` disables it.
        audit: the auditor stage (``evolve.archive.referee.Auditor``): candidates about to become the
            run's best are audited, flagged ones re-evaluated strictly before promotion;
            None: its defaults (enabled).
        review_diff: a model's review of a change the auditor reads
            (``evolve.research.review.Reviewer``); None: static detectors only.
        budget_errors: exception types that mean "stop proposing, finish cleanly".
        replay: the recorded events of the run being replayed (``Store.events``), followed
            in order before the driver goes on by itself.
        run_dir: named in messages that tell the user where to look.
        cost: USD spent so far on LLM calls (for the progress bar).
    """

    def __init__(
        self,
        *,
        engine: Engine,
        backend: Backend,
        settings: SearchSettings,
        noise: noise.NoiseSettings | None = None,
        audit: AuditSettings | None = None,
        review_diff: ReviewDiff | None = None,
        budget_errors: tuple[type[BaseException], ...] = (),
        replay: list[tuple[int, str, int]] | None = None,
        run_dir: Path | None = None,
        cost: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.engine = engine
        self.backend = backend
        self.settings = settings
        self.referee = (
            engine.referee(noise, self.reevaluate, backend.slots)
            if noise is not None and noise.enabled
            else None
        )
        audit = audit or AuditSettings()
        self.auditor = (
            engine.auditor(audit, self._strict_reevaluation, review_diff) if audit.enabled else None
        )
        self.budget_errors = budget_errors
        self.run_dir = run_dir
        self.cost = cost
        self.in_flight = settings.proposals_in_flight(backend.slots)
        self.window = self.in_flight + backend.slots + settings.lookahead - 1
        self._replay = list(replay or [])
        self._slots = Slots(backend.slots)
        self._tasks: set[asyncio.Task] = set()
        self._running = 0  # proposals whose operator is running
        self._unfinished = 0  # asked and not yet told: running, queued or under evaluation
        self._pending = 0  # admitted, waiting for a slot or holding one (not yet audited)
        self._stop_reason: str | None = None
        self._deadline: float | None = None
        self._streak = Streak(run_dir)
        self._finished = asyncio.Event()
        self._outcomes: dict[int, asyncio.Future] = {}  # replay: a proposal's outcome by seq
        self._results: dict[int, asyncio.Future] = {}  # replay: an evaluation's verdict by seq
        self._asks: dict[int, Ask] = {}  # started, not yet admitted
        self._admitted: set[int] = set()
        self._told: set[int] = set()
        self._progress = Progress(
            total=settings.max_candidates,
            desc=engine.name,
            enabled=settings.progress,
        )
        self._failure: BaseException | None = None

    # --- the run ------------------------------------------------------------------------------------

    async def run(self) -> Summary:
        """Evaluate the seed if needed, finish what a stopped run left, and search to a budget."""
        self.engine.check_harness()
        await self._evaluate_seed()
        timer = None
        if self.settings.max_wall_s is not None:
            self._deadline = time.monotonic() + self.settings.max_wall_s
            timer = asyncio.get_running_loop().call_later(self.settings.max_wall_s, self._pump)
        for candidate in self.engine.pending():
            log.info(
                "re-queueing %s (it was %s when the last run stopped)",
                candidate.id[:8],
                candidate.status,
            )
            self._unfinished += 1
            self._pending += 1
            self._spawn(self._judge(candidate))
        with self._progress.shown(self.engine.evaluated):
            self._show_progress()
            try:
                for ask in self.engine.reissue():
                    log.info(
                        "asking #%d again (it was in flight when the last run stopped)", ask.seq
                    )
                    self._start(ask)
                if self._replay and self.engine.fresh:  # a new run replaying another
                    await self._follow_replay()
                self._replay = []
                self._pump()
                await self._finished.wait()
                if self._failure is not None:
                    raise self._failure
            finally:
                if timer is not None:
                    timer.cancel()
                await self._cancel_all()
        return self.summary()

    def summary(self, reason: str | None = None) -> Summary:
        """How the run stands now (``reason`` overrides why it ended)."""
        best = self.engine.best()
        return Summary(
            reason=reason or self._stop_reason or "finished",
            evaluated=self.engine.evaluated,
            failures=self.engine.failures,
            best_id=best[0] if best else None,
            best=best[1] if best else None,
            seed_fitness=self.engine.seed_fitness(),
        )

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and self._failure is None:
            self._failure = task.exception()  # a bug or a harness change: end the run with it
            self._finished.set()

    async def _cancel_all(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)

    # --- the seed -----------------------------------------------------------------------------------

    async def _evaluate_seed(self) -> None:
        seed = self.engine.seed_to_evaluate()
        if seed is None:
            if self.referee is not None:
                self.referee.load()
            return
        log.info("evaluating the seed program %s", seed.id[:8])
        evaluation = await self.backend.evaluate(0, self.engine.start_evaluation(seed))
        state = None
        if self.referee is not None and evaluation.ok:
            evaluation = await self.referee.calibrate(seed, evaluation)
            if self.referee.calibration is not None:
                state = {noise.STATE_KEY: self.referee.calibration.to_json()}
        self.engine.tell(seed, evaluation, state=state)
        if not evaluation.ok:
            raise self.engine.seed_error(evaluation)
        log.info("seed program: %s = %s", self.engine.objective, evaluation.fitness)

    # --- proposals ----------------------------------------------------------------------------------

    def _budget_left(self) -> bool:
        if self._stop_reason:
            return False
        if self.engine.evaluated + self._unfinished >= self.settings.max_candidates:
            if self._unfinished == 0:
                self._stop_reason = f"reached search.max_candidates={self.settings.max_candidates}"
            return False
        if self._deadline is not None and time.monotonic() >= self._deadline:
            self._stop_reason = f"reached search.max_wall_s={self.settings.max_wall_s}"
            return False
        return True

    def _pump(self) -> None:
        """Start every proposal the limits allow; notice when the run is over."""
        following = bool(self._replay)
        while (
            not following
            and self._budget_left()
            and self._running < self.in_flight
            and self._running + self._pending < self.window
        ):
            self._start(self.engine.ask()[0])
        if self._running == 0 and self._unfinished == 0 and not following:
            self._budget_left()  # names the budget that ended the run
            self._finished.set()

    def _start(self, ask: Ask) -> None:
        self._running += 1
        self._unfinished += 1
        self._asks[ask.seq] = ask
        self._spawn(self._propose(ask))

    async def _propose(self, ask: Ask) -> None:
        try:
            outcome = await self.engine.propose(ask)
        except self.budget_errors as exc:
            self._running -= 1
            self._unfinished -= 1
            self._stop_reason = self._stop_reason or str(exc)
            if self._replay:
                self._outcome_future(ask.seq).cancel()
            self._pump()
            return
        self._running -= 1
        if self._replay:
            self._outcome_future(ask.seq).set_result(outcome)
            return
        self._admit(ask, outcome)
        self._pump()

    def _admit(self, ask: Ask, outcome: Outcome) -> None:
        self._admitted.add(ask.seq)
        self._asks.pop(ask.seq, None)
        admitted = self.engine.admit(ask, outcome)
        if isinstance(admitted, Rejection):
            self._unfinished -= 1
            if self._replay:  # a record that evaluated it waits for no verdict
                self._result_future(ask.seq).set_result(None)
            self._stop_reason = self._stop_reason or self._streak.rejected(admitted)
            return
        self._streak.admitted()
        self._pending += 1
        self._spawn(self._judge(admitted))

    # --- evaluations --------------------------------------------------------------------------------

    async def _judge(self, candidate: Candidate) -> None:
        """Evaluate an admitted candidate on a slot, settle and audit its result, and tell it."""
        async with self._slot() as slot:
            job = self.engine.start_evaluation(candidate)
            evaluation = await self.backend.evaluate(slot, job)
            samples: list[Evaluation] = []
            if self.referee is not None:
                evaluation, samples = await self.referee.settle(slot, candidate, evaluation)
        verdict = None
        if self.auditor is not None:
            if self.auditor.due(candidate, evaluation) is not None and not self._replay:
                self._pump()  # its audit holds no place in the window: another proposal may start
            evaluation, verdict = await self.auditor.review(
                candidate, evaluation, next_sample=len(samples) + 1
            )
        told = (candidate, evaluation, samples, verdict)
        if self._replay:
            self._result_future(candidate.seq).set_result(told)
        else:
            self._tell(*told)
            self._pump()

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[int]:
        """A slot for an admitted candidate (counted in ``_pending`` from its admission until
        the slot is given back)."""
        try:
            async with self._slots.lent() as slot:
                yield slot
        finally:
            self._pending -= 1

    async def reevaluate(
        self, slot: int, candidate: Candidate, k: int, *, strict: bool = False
    ) -> Evaluation:
        """Evaluate ``candidate`` again with its ``k``-th extra seed (the referee's samples;
        ``strict``: the auditor's, in the fitness's strict mode)."""
        job = self.engine.reevaluation(candidate, k, strict=strict)
        return await self.backend.evaluate(slot, job)

    async def _strict_reevaluation(self, candidate: Candidate, k: int) -> Evaluation:
        """The auditor's strict re-evaluation, on the next slot given back (before new candidates)."""
        async with self._slots.lent(first=True) as slot:
            return await self.reevaluate(slot, candidate, k, strict=True)

    def _tell(
        self,
        candidate: Candidate,
        evaluation: Evaluation,
        samples: list[Evaluation],
        verdict: AuditVerdict | None = None,
    ) -> None:
        self._told.add(candidate.seq)
        before = self.engine.best()
        result = self.engine.tell(candidate, evaluation, samples, audit=verdict)
        self._unfinished -= 1
        new_best = self.engine.is_new_best(candidate.id, before)
        log.info(
            "%s", evaluation_line(candidate, evaluation, result, self.engine.objective, new_best)
        )
        self._show_progress()

    def _show_progress(self) -> None:
        best = self.engine.best()
        self._progress.update(
            evaluated=self.engine.evaluated,
            best=best[1] if best else None,
            failures=self.engine.failures,
            cost=self.cost,
        )

    # --- replay -------------------------------------------------------------------------------------

    def _outcome_future(self, seq: int) -> asyncio.Future:
        return self._outcomes.setdefault(seq, asyncio.get_running_loop().create_future())

    def _result_future(self, seq: int) -> asyncio.Future:
        return self._results.setdefault(seq, asyncio.get_running_loop().create_future())

    async def _follow_replay(self) -> None:
        """Make the recorded run's asks, admissions and results happen in its order, then go on alone."""
        for _, kind, seq in self._replay:
            if self._stop_reason:
                break
            if kind == "ask":
                ask = self.engine.ask()[0]
                if ask.seq != seq:
                    break  # the replay diverged from the record
                self._start(ask)
            elif kind == "admit" and seq in self._asks:
                try:
                    outcome = await self._outcome_future(seq)
                except asyncio.CancelledError:
                    break  # no recorded answer for it: the stop reason says so
                self._admit(self._asks[seq], outcome)
            elif kind == "tell" and seq in self._admitted:
                told = await self._result_future(seq)
                if told is not None:
                    self._tell(*told)
        self._replay = []
        for seq, future in list(self._outcomes.items()):  # answered, past the record
            if future.done() and not future.cancelled() and seq not in self._admitted:
                self._admit(self._asks[seq], future.result())
        for seq, future in list(self._results.items()):  # evaluated, past the record
            if future.done() and future.result() is not None and seq not in self._told:
                self._tell(*future.result())
