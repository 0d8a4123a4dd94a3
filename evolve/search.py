"""The asynchronous search loop: propose -> evaluate -> add, with budgets, dedup and resume.

One proposer fills a bounded queue; one evaluator per backend slot drains it; results are
added to the archive in one store transaction each. Proposal ``k`` is made only when all
but ``depth - 1`` earlier proposals are finished (``depth`` = workers + lookahead), and
draws from its own random stream seeded by (run seed, k). So with one worker the sequence
of candidates is a pure function of the seed and the fitness, whether or not the run was
interrupted and resumed in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from evolve import noise as noise_aware
from evolve.archive import Archive
from evolve.backends import Backend, Job
from evolve.emitters import Emitter
from evolve.fitness import Benchmark
from evolve.llm.ledger import link_calls
from evolve.operators.base import OperatorRejected
from evolve.operators.edits import EditError, check_edit, normalized_hash
from evolve.referee import Referee
from evolve.settings import SearchSettings
from evolve.store import Store
from evolve.types import (
    AddResult,
    AddStatus,
    Candidate,
    CandidateStatus,
    EvalStatus,
    Evaluation,
    EvolveError,
    Proposal,
    content_hash,
)

log = logging.getLogger("evolve")

SEED_OPERATOR = "seed"
MAX_DUPLICATE_ATTEMPTS = 20
MAX_REJECTIONS_IN_A_ROW = 50


class HarnessChanged(EvolveError):
    """The benchmark's harness files changed during the run."""


@dataclass(frozen=True)
class Summary:
    """How a run ended."""

    reason: str
    evaluated: int
    failures: int
    best_id: str | None
    best: float | None
    seed_fitness: float | None


def proposal_rng(seed: int, seq: int, attempt: int) -> random.Random:
    """The random stream of proposal ``seq`` (attempt > 0 after a duplicate)."""
    return random.Random(f"{seed}:{seq}:{attempt}")


def eval_seed(seed: int, seq: int) -> int:
    return (seed * 1_000_003 + seq) % (2**31)


class Search:
    """One run of the evolutionary loop over a store.

    Args:
        store: the run's archive file (also the checkpoint).
        archive: the MAP-Elites grids over ``store``.
        emitter: chooses parents and operators.
        backend: evaluates candidates.
        benchmark: the problem.
        settings: budgets.
        cost: returns the USD spent so far on LLM calls (for the progress bar).
        budget_errors: exception types that mean "stop proposing, finish cleanly".
        noise: noise-aware selection (``evolve.noise``); None or ``seeds: 1`` disables it.
    """

    def __init__(
        self,
        *,
        store: Store,
        archive: Archive,
        emitter: Emitter,
        backend: Backend,
        benchmark: Benchmark,
        settings: SearchSettings,
        cost: Callable[[], float] = lambda: 0.0,
        budget_errors: tuple[type[BaseException], ...] = (),
        noise: noise_aware.NoiseSettings | None = None,
    ) -> None:
        self.store = store
        self.archive = archive
        self.emitter = emitter
        self.backend = backend
        self.benchmark = benchmark
        self.settings = settings
        self.cost = cost
        self.budget_errors = budget_errors
        self.harness_hash = benchmark.harness_hash()
        self.depth = backend.slots + settings.lookahead
        self._changed = asyncio.Condition()
        self._queue: asyncio.Queue[Candidate | None] = asyncio.Queue()
        self._stop_reason: str | None = None
        self._bar: tqdm | None = None
        self._counts: Counter[CandidateStatus] = Counter()
        self.referee = (
            Referee(
                store=store,
                archive=archive,
                settings=noise,
                reevaluate=self._reevaluate,
                sample_seed=self._sample_seed,
                slots=backend.slots,
            )
            if noise is not None and noise.enabled
            else None
        )

    # --- bookkeeping ---------------------------------------------------------------------------

    def _load_counts(self) -> None:
        rows = self.store.conn.execute("SELECT status, COUNT(*) FROM candidates GROUP BY status")
        self._counts = Counter({CandidateStatus(status): n for status, n in rows})

    def _move(self, old: CandidateStatus | None, new: CandidateStatus) -> None:
        if old is not None:
            self._counts[old] -= 1
        self._counts[new] += 1

    def _in_flight(self) -> int:
        return self._counts[CandidateStatus.PROPOSED] + self._counts[CandidateStatus.EVALUATING]

    def _terminal(self) -> int:
        return sum(self._counts.values()) - self._in_flight()

    def _evaluated(self) -> int:
        return self._counts[CandidateStatus.DONE] + self._counts[CandidateStatus.FAILED]

    def _failures(self) -> int:
        return self._counts[CandidateStatus.FAILED]

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _refresh_bar(self) -> None:
        if self._bar is None:
            return
        self._bar.n = self._evaluated()
        best = self.archive.best()
        self._bar.set_postfix(
            best=f"{best[1]:.6g}" if best else "-",
            failures=self._failures(),
            cost=f"${self.cost():.2f}",
            refresh=False,
        )
        self._bar.refresh()

    def _check_harness(self) -> None:
        if self.benchmark.harness_hash() != self.harness_hash:
            raise HarnessChanged(
                f"the harness files of benchmark {self.benchmark.name!r} changed during the run; "
                "restore them (the run's hash is in the runs table) or start a new run"
            )

    def _check_started_harness(self) -> None:
        """A resumed run must measure with the harness files it started with."""
        first = self.store.first_run()
        started = first.get("harness_hash") if first else None
        if started and started != self.harness_hash:
            raise HarnessChanged(
                f"the harness files of benchmark {self.benchmark.name!r} differ from those the run started "
                f"with (hash {started[:12]}, now {self.harness_hash[:12]}); restore them to resume, or "
                "start a new run"
            )

    # --- evaluation and recording ----------------------------------------------------------------

    async def _evaluate(self, slot: int, candidate: Candidate) -> Evaluation:
        self._check_harness()
        with self.store.transaction():
            self.store.set_status(candidate.id, CandidateStatus.EVALUATING)
        self._move(
            candidate.status
            if candidate.status == CandidateStatus.EVALUATING
            else CandidateStatus.PROPOSED,
            CandidateStatus.EVALUATING,
        )
        job = Job(
            candidate_id=candidate.id,
            files=dict(candidate.files),
            seed=eval_seed(self.settings.seed, candidate.seq),
            timeout_s=self.benchmark.timeout_s,
        )
        return await self.backend.evaluate(slot, job)

    def _record(
        self, candidate: Candidate, evaluation: Evaluation, samples: Sequence[Evaluation] = ()
    ) -> AddResult | None:
        """Store an evaluation, offer it to the archive and teach the emitter, atomically.

        ``samples``: extra evaluations with other seeds (noise-aware selection), stored
        before the verdict ``evaluation`` as rows of stage ``reevaluation``.
        """
        islands = (
            range(self.archive.islands)
            if candidate.operator == SEED_OPERATOR
            else (candidate.island,)
        )
        with self.store.transaction():
            status = CandidateStatus.DONE if evaluation.ok else CandidateStatus.FAILED
            self.store.set_status(candidate.id, status)
            self._move(CandidateStatus.EVALUATING, status)
            for sample in samples:
                self.store.add_evaluation(
                    candidate.id, replace(sample, stage=noise_aware.REEVALUATION)
                )
            self.store.add_evaluation(candidate.id, evaluation)
            calibration = self.referee and self.referee.calibration
            if candidate.operator == SEED_OPERATOR and calibration is not None:
                self.store.set_state(noise_aware.STATE_KEY, calibration.to_json())
            results = [self.archive.add(candidate.id, evaluation, island=i) for i in islands]
            result = results[0] if evaluation.ok else None
            if candidate.operator != SEED_OPERATOR:
                self.emitter.tell(self._arm_of(candidate), result)
                self.store.set_state("bandit", self.emitter.state.to_json())
            self.archive.record_stats(
                evaluated=self._evaluated(), failures=self._failures(), cost=self.cost()
            )
        return result

    @staticmethod
    def _arm_of(candidate: Candidate) -> str:
        return f"{candidate.operator}@{candidate.model}" if candidate.model else candidate.operator

    def _record_rejection(self, seq: int, island: int, rejected: OperatorRejected) -> None:
        proposal = Proposal(
            files=rejected.files,
            parents=rejected.parents,
            operator=rejected.arm.split("@", 1)[0],
            model=rejected.model,
            description=rejected.reason,
            prompt_hash=rejected.prompt_hash,
            island=island,
        )
        rejected_id = content_hash({"<rejected>": f"{seq}:{rejected.reason}:{rejected.answer}"})
        with self.store.transaction():
            self.store.add_candidate(
                proposal, seq=seq, status=CandidateStatus.REJECTED, candidate_id=rejected_id
            )
            link_calls(self.store, rejected.prompt_hash, rejected_id)
            self.store.add_evaluation(
                rejected_id,
                Evaluation(
                    status=EvalStatus.REJECTED,
                    artifacts={"error": rejected.reason, "answer": rejected.answer[-4000:]},
                ),
            )
            self.emitter.tell(rejected.arm, None)
            self.store.set_state("bandit", self.emitter.state.to_json())
        self._move(None, CandidateStatus.REJECTED)
        source = "" if rejected.reason.startswith(proposal.operator) else f"{rejected.arm}: "
        log.info("#%d refused before evaluation: %s%s", seq, source, rejected.reason[:200])

    # --- the seed ----------------------------------------------------------------------------------

    async def _ensure_seed(self) -> None:
        seeds = self.store.conn.execute(
            "SELECT id, status FROM candidates WHERE operator=? ORDER BY seq LIMIT 1",
            (SEED_OPERATOR,),
        ).fetchone()
        if seeds is None:
            files = self.benchmark.seed_files()
            proposal = Proposal(files=files, operator=SEED_OPERATOR, description="the seed program")
            candidate = self.store.add_candidate(proposal, seq=0, norm_hash=normalized_hash(files))
            self._move(None, CandidateStatus.PROPOSED)
        elif seeds[1] in (CandidateStatus.PROPOSED, CandidateStatus.EVALUATING):
            candidate = self.store.candidate(seeds[0])
        else:
            evaluation = self.store.evaluation(seeds[0])
            if evaluation is None or not evaluation.ok:
                raise self._seed_error(evaluation)
            return
        log.info("evaluating the seed program %s", candidate.id[:8])
        evaluation = await self._evaluate(0, candidate)
        if self.referee is not None and evaluation.ok:
            evaluation = await self.referee.calibrate(candidate, evaluation)
        self._record(candidate, evaluation)
        if not evaluation.ok:
            raise self._seed_error(evaluation)
        log.info("seed program: %s = %s", self.archive.objective.name, evaluation.fitness)

    # --- noise-aware selection (evolve.referee) --------------------------------------------------

    def _sample_seed(self, candidate: Candidate, k: int) -> int:
        """The evaluation seed of the ``k``-th extra sample of ``candidate``."""
        return noise_aware.reevaluation_seed(eval_seed(self.settings.seed, candidate.seq), k)

    async def _reevaluate(self, slot: int, candidate: Candidate, k: int) -> Evaluation:
        """Evaluate ``candidate`` again with its ``k``-th extra seed."""
        self._check_harness()
        job = Job(
            candidate_id=candidate.id,
            files=dict(candidate.files),
            seed=self._sample_seed(candidate, k),
            timeout_s=self.benchmark.timeout_s,
        )
        return await self.backend.evaluate(slot, job)

    def _seed_error(self, evaluation: Evaluation | None) -> EvolveError:
        if evaluation is None:
            return EvolveError("the seed program has no evaluation; resume the run to evaluate it")
        details = "\n".join(f"  {k}: {v}" for k, v in evaluation.artifacts.items() if v)[-3000:]
        return EvolveError(
            f"the seed program of benchmark {self.benchmark.name!r} fails its own evaluation "
            f"(status {evaluation.status}); fix the seed program or the fitness. Details:\n{details}"
        )

    # --- proposer and evaluators -------------------------------------------------------------------

    def _budget_left(self, start: float) -> bool:
        if self._stop_reason:
            return False
        if self._evaluated() + self._in_flight() >= self.settings.max_candidates:
            self._stop_reason = f"reached search.max_candidates={self.settings.max_candidates}"
            return False
        if (
            self.settings.max_wall_s is not None
            and time.monotonic() - start >= self.settings.max_wall_s
        ):
            self._stop_reason = f"reached search.max_wall_s={self.settings.max_wall_s}"
            return False
        return True

    async def _propose_one(self, seq: int) -> Candidate | None:
        """Make proposal ``seq``; returns the stored candidate to evaluate, or None if rejected."""
        island = seq % self.archive.islands
        interval = self.settings.migration_interval
        migrant = self.archive.migrant_for(island) if interval and seq % interval == 0 else None
        for attempt in range(MAX_DUPLICATE_ATTEMPTS):
            rng = proposal_rng(self.settings.seed, seq, attempt)
            try:
                key, proposal = await self.emitter.propose(
                    seq=seq, rng=rng, island=island, migrant=migrant
                )
                if self.store.has_candidate(proposal.id):
                    continue  # identical content is never evaluated twice: draw again
                parent_files = self.store.candidate(proposal.parents[0][0]).files
                try:
                    check_edit(parent_files, proposal.files, self.benchmark.is_editable)
                except EditError as exc:
                    raise self._rejection(str(exc), key, proposal) from exc
                norm = normalized_hash(proposal.files)
                twin = self.store.has_equivalent(norm)
                if twin is not None:
                    reason = (
                        f"near-duplicate of {twin[:8]} (same code up to comments and whitespace)"
                    )
                    raise self._rejection(reason, key, proposal)
            except OperatorRejected as rejected:
                self._record_rejection(seq, island, rejected)
                return None
            candidate = self.store.add_candidate(proposal, seq=seq, norm_hash=norm)
            link_calls(self.store, proposal.prompt_hash, candidate.id)
            self._move(None, CandidateStatus.PROPOSED)
            return candidate
        self._stop_reason = f"{MAX_DUPLICATE_ATTEMPTS} proposals in a row duplicated existing candidates; the search has converged"
        return None

    @staticmethod
    def _rejection(reason: str, key: str, proposal: Proposal) -> OperatorRejected:
        rejected = OperatorRejected(reason, model=proposal.model, prompt_hash=proposal.prompt_hash)
        rejected.arm, rejected.parents, rejected.files = key, proposal.parents, dict(proposal.files)
        return rejected

    async def _proposer(self, start: float) -> None:
        seq = self.store.next_seq()
        rejections_in_a_row = 0
        try:
            while self._budget_left(start):
                async with self._changed:
                    await self._changed.wait_for(
                        lambda s=seq: self._terminal() >= s - self.depth + 1
                    )
                if not self._budget_left(start):
                    break
                try:
                    candidate = await self._propose_one(seq)
                except self.budget_errors as exc:
                    self._stop_reason = str(exc)
                    break
                seq += 1
                if candidate is None:
                    rejections_in_a_row += 1
                    if rejections_in_a_row >= MAX_REJECTIONS_IN_A_ROW:
                        self._stop_reason = (
                            f"{MAX_REJECTIONS_IN_A_ROW} proposals in a row were rejected; see the rejected "
                            "candidates' reasons (python -m evolve.browse RUN stats)"
                        )
                    await self._notify()
                    continue
                rejections_in_a_row = 0
                await self._queue.put(candidate)
        finally:
            for _ in range(self.backend.slots):
                await self._queue.put(None)

    async def _evaluator(self, slot: int) -> None:
        while (candidate := await self._queue.get()) is not None:
            evaluation = await self._evaluate(slot, candidate)
            samples: list[Evaluation] = []
            if self.referee is not None:
                evaluation, samples = await self.referee.settle(slot, candidate, evaluation)
            best_before = self.archive.best()
            result = self._record(candidate, evaluation, samples)
            best = self.archive.best()
            new_best = best is not None and best[0] == candidate.id and best != best_before
            log.info(
                "%s",
                evaluation_line(
                    candidate, evaluation, result, self.archive.objective.name, new_best
                ),
            )
            self._refresh_bar()
            await self._notify()

    # --- the run ------------------------------------------------------------------------------------

    async def run(self) -> Summary:
        """Evaluate the seed if needed, re-queue unfinished candidates, and search until a budget."""
        self._check_started_harness()
        self.emitter.state = type(self.emitter.state).from_json(self.store.get_state("bandit"))
        self._load_counts()
        await self._ensure_seed()
        start = time.monotonic()  # search.max_wall_s counts proposing time, after the seed
        if self.referee is not None and self.referee.calibration is None:
            self.referee.load()
        seed_eval = self.store.seed_evaluation()
        for candidate in self.store.pending():
            log.info(
                "re-queueing %s (it was %s when the last run stopped)",
                candidate.id[:8],
                candidate.status,
            )
            await self._queue.put(candidate)
        with (
            logging_redirect_tqdm(),
            tqdm(
                total=self.settings.max_candidates,
                initial=self._evaluated(),
                desc=self.benchmark.name,
                disable=not self.settings.progress,
                dynamic_ncols=True,
            ) as bar,
        ):
            self._bar = bar
            self._refresh_bar()
            workers = [
                asyncio.create_task(self._evaluator(slot)) for slot in range(self.backend.slots)
            ]
            proposer = asyncio.create_task(self._proposer(start))
            try:
                await asyncio.gather(proposer, *workers)
            finally:
                for task in (proposer, *workers):
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.gather(proposer, *workers, return_exceptions=True)
                self._bar = None
        best = self.archive.best()
        return Summary(
            reason=self._stop_reason or "finished",
            evaluated=self._evaluated(),
            failures=self._failures(),
            best_id=best[0] if best else None,
            best=best[1] if best else None,
            seed_fitness=seed_eval.fitness if seed_eval else None,
        )


OUTCOMES = {
    AddStatus.NEW: "fills a new cell",
    AddStatus.IMPROVE_EXISTING: "improves its cell",
    AddStatus.NOT_ADDED: "not kept",
}


def evaluation_line(
    candidate: Candidate,
    evaluation: Evaluation,
    result: AddResult | None,
    objective: str,
    new_best: bool,
) -> str:
    """One log line per finished evaluation: which candidate, its verdict, and what the archive did."""
    source = f"{candidate.operator}/{candidate.model}" if candidate.model else candidate.operator
    wall = f"{evaluation.wall_s:.1f}" if evaluation.wall_s < 10 else f"{evaluation.wall_s:.0f}"
    head = f"#{candidate.seq} {source} (island {candidate.island}, {wall} s)"
    if not evaluation.ok:
        error = str(evaluation.artifacts.get("error") or "").strip().splitlines()
        return f"{head}: {evaluation.status}: {error[0][:200] if error else 'no error message'}"
    outcome = OUTCOMES[result.status if result else AddStatus.NOT_ADDED]
    samples = evaluation.metrics.get("fitness_n", 1)
    mean = f" (mean of {samples} seeds)" if samples > 1 else ""
    verdict = f"{objective} = {evaluation.fitness:.6g}{mean}, {outcome}"
    return f"{head}: {verdict}{', NEW BEST' if new_best else ''}: {candidate.description[:120]}"
