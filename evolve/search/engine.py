"""The ask/tell core of a run: proposals asked from the archive, checked once, results told back.

``Engine`` owns the archive, the emitter (bandit state), dedup, the one edit check, the
rejection records and the candidate counts; every change it makes is one store
transaction. It acts on what its parts decide: the emitter chooses an ask's arm and parents,
its operator proposes the child, ``evolve.search.novelty`` names a proposal's twin and why,
``evolve.research.summary.NotebookFeed`` keeps the research notebook and its summaries,
``evolve.search.jobs`` says what each evaluation is handed. It never waits for anything but the
operator it was asked to run, so any loop can drive it through its methods alone:
``evolve.search.driver`` keeps many proposals and evaluations in flight, a notebook can go one at a
time::

    (ask,) = engine.ask()                   # parents chosen now, from the archive as it is
    outcome = await engine.propose(ask)     # the operator (an LLM call) runs
    candidate = engine.admit(ask, outcome)  # checked and stored, or recorded as rejected
    if isinstance(candidate, Candidate):
        job = engine.start_evaluation(candidate)  # what its evaluation is handed
        engine.tell(candidate, evaluate(job))     # results may be told in any order

Each call that changes the run is numbered (an *event*) and the numbers are stored in the
``schedule`` table with the ask itself, so a run can be replayed in the order it happened.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from evolve.archive import noise
from evolve.archive.grid import Archive
from evolve.archive.referee import (
    STRICT,
    Auditor,
    AuditVerdict,
    Reevaluate,
    Referee,
    ReviewDiff,
    StrictReevaluate,
)
from evolve.harness.fitness import Benchmark
from evolve.llm import LLMClient
from evolve.operators.base import Operator, OperatorRejected, OperatorRequest
from evolve.operators.edits import EditError, check_edit, normalized_hash
from evolve.research.notebook import Notebook
from evolve.research.summary import NotebookFeed, Summariser
from evolve.search.emitters import Ask, Emitter, arm_key
from evolve.search.jobs import Jobs
from evolve.search.novelty import Novelty
from evolve.search.rejections import Rejection, record_rejection
from evolve.settings import AuditSettings
from evolve.store.database import Store
from evolve.types import (
    AddResult,
    AddStatus,
    Candidate,
    CandidateStatus,
    EdgeRole,
    Evaluation,
    EvolveError,
    Job,
    Proposal,
)

log = logging.getLogger("evolve")

SEED_OPERATOR = "seed"
REDRAWS = 20  # a built-in operator's child identical to a stored one is drawn again this often


Outcome = Proposal | Rejection


def proposal_rng(seed: int, seq: int, attempt: int, stream: str = "ask") -> random.Random:
    """The random stream of proposal ``seq``: ``ask`` (arm, parents) or ``operator`` (its sampling)."""
    return random.Random(f"{seed}:{seq}:{attempt}:{stream}")


@dataclass(eq=False, kw_only=True)
class Engine:
    """Ask/tell over one run's store (see the module docstring).

    Attributes:
        store: the run's archive file.
        archive: the MAP-Elites grids over ``store``.
        emitter: chooses arms and parents, learns from results.
        benchmark: the problem (editable files, timeout, harness hash).
        seed: the run's seed.
        migration_interval: every N proposals an island breeds from its neighbour's best.
        cost: USD spent so far on LLM calls (recorded with the stats).
        notebook_chars: the research notebook's size (``evolve.research.notebook``); it is kept only
            when an operator asks a model.
        summariser: writes a model's summary of the notebook every few proposals
            (``evolve.research.summary``); None: none.
        llm: the run's LLM client; the novelty check's embeddings are its calls (needed when
            ``archive.novelty.embedding_model`` is set).
    """

    store: Store
    archive: Archive
    emitter: Emitter
    benchmark: Benchmark
    seed: int = 0
    migration_interval: int = 25
    cost: Callable[[], float] = lambda: 0.0
    notebook_chars: int = 6000
    summariser: Summariser | None = None
    llm: LLMClient | None = None

    def __post_init__(self) -> None:
        """Continue from the store: bandit state, counts, the next seq and event, open asks."""
        self._jobs = Jobs(self.benchmark, self.seed)
        self.novelty = Novelty(
            store=self.store,
            settings=self.archive.novelty,
            editable=self.benchmark.is_editable,
            objective=self.archive.objective.name,
            descriptors=[d.name for d in self.archive.descriptors],
            client=self.llm,
        )
        state = self.emitter.state
        self.emitter.state = type(state).from_json(self.store.get_state("bandit"))
        self.counts: Counter[CandidateStatus] = Counter(self.store.status_counts())
        self.next_seq = self.store.next_seq()
        self.event = self.store.last_event() + 1
        self._reissue = [Ask.from_json(data) for data in self.store.open_asks()]
        self._evaluating: set[str] = set()
        asks_models = any(getattr(op, "model", None) for op, _ in self.emitter.arms.values())
        notebook = (
            Notebook(self.store, editable=self.benchmark.is_editable, max_chars=self.notebook_chars)
            if asks_models
            else None
        )
        self.notebook = NotebookFeed(self.store, notebook, self.summariser)

    # --- counts ------------------------------------------------------------------------------------

    @property
    def evaluated(self) -> int:
        return self.counts[CandidateStatus.DONE] + self.counts[CandidateStatus.FAILED]

    @property
    def failures(self) -> int:
        return self.counts[CandidateStatus.FAILED]

    @property
    def told(self) -> int:
        """Candidates whose outcome is known (evaluated or rejected), the seed included."""
        return self.evaluated + self.counts[CandidateStatus.REJECTED]

    def _move(self, old: CandidateStatus | None, new: CandidateStatus) -> None:
        if old is not None:
            self.counts[old] -= 1
        self.counts[new] += 1

    def _next_event(self) -> int:
        self.event += 1
        return self.event - 1

    # --- what a driver reads and builds from the run ---------------------------------------------

    @property
    def name(self) -> str:
        """The benchmark's name."""
        return self.benchmark.name

    @property
    def fresh(self) -> bool:
        """Whether no proposal has been asked yet (the seed aside)."""
        return self.next_seq <= 1

    @property
    def objective(self) -> str:
        """The objective's name."""
        return self.archive.objective.name

    def check_harness(self) -> None:
        """Raise ``HarnessChanged`` if the harness files differ from those the run started with
        (first, or in this session): a run checks this before it starts or resumes."""
        self._jobs.check_harness(started=(self.store.first_run() or {}).get("harness_hash"))

    def pending(self) -> list[Candidate]:
        """The candidates a stopped run left proposed or under evaluation, in proposal order."""
        return self.store.pending()

    def best(self) -> tuple[str, float] | None:
        """(candidate id, objective value) of the run's best elite; None before the seed is told."""
        return self.archive.best()

    def is_new_best(self, candidate_id: str, before: tuple[str, float] | None) -> bool:
        """Whether ``candidate_id`` is the run's best now, beyond the measured noise of ``before``
        (the best before it was told), not only first in the archive."""
        best = self.archive.best()
        return (
            best is not None
            and best[0] == candidate_id
            and (before is None or self.archive.beyond_noise(best[1], before[1]))
        )

    def seed_fitness(self) -> float | None:
        """The seed program's latest score, or None."""
        seed = self.store.seed_evaluation()
        return seed.fitness if seed else None

    def referee(self, settings: noise.NoiseSettings, reevaluate: Reevaluate, slots: int) -> Referee:
        """The run's noise-aware referee (``evolve.archive.referee``); its extra samples are evaluated by
        ``reevaluate`` on up to ``slots`` slots, with the seeds of ``reevaluation``'s jobs."""
        return Referee(
            store=self.store,
            archive=self.archive,
            settings=settings,
            reevaluate=reevaluate,
            sample_seed=lambda candidate, k: self._jobs.job(candidate, k).seed,
            slots=slots,
        )

    def auditor(
        self, settings: AuditSettings, reevaluate: StrictReevaluate, review_diff: ReviewDiff | None
    ) -> Auditor:
        """The run's auditor (``evolve.archive.referee``): strict re-evaluations by ``reevaluate``, the
        model's review by ``review_diff`` when ``settings.review`` asks for one."""
        return Auditor(
            store=self.store,
            archive=self.archive,
            reevaluate=reevaluate,
            strict_seeds=settings.strict_seeds,
            review_diff=review_diff if settings.review else None,
            prescribed=self.benchmark.prescribed,
        )

    # --- the seed ------------------------------------------------------------------------------------

    def seed_to_evaluate(self) -> Candidate | None:
        """The seed program when it still needs its evaluation (stored first if new); None once it has one.

        Raises:
            EvolveError: the seed program failed its own evaluation.
        """
        seed = self.store.seed_candidate()
        if seed is None:
            files = self.benchmark.seed_files()
            proposal = Proposal(files=files, operator=SEED_OPERATOR, description="the seed program")
            seed = self.store.add_candidate(proposal, seq=0, norm_hash=normalized_hash(files))
            self._move(None, CandidateStatus.PROPOSED)
            self.next_seq = max(self.next_seq, 1)
        if seed.status in (CandidateStatus.PROPOSED, CandidateStatus.EVALUATING):
            return seed
        evaluation = self.store.evaluation(seed.id)
        if evaluation is None or not evaluation.ok:
            raise self.seed_error(evaluation)
        return None

    def seed_error(self, evaluation: Evaluation | None) -> EvolveError:
        """The error that ends a run whose seed program fails (``evaluation``: its verdict)."""
        if evaluation is None:
            return EvolveError("the seed program has no evaluation; resume the run to evaluate it")
        details = "\n".join(f"  {k}: {v}" for k, v in evaluation.artifacts.items() if v)[-3000:]
        return EvolveError(
            f"the seed program of benchmark {self.benchmark.name!r} fails its own evaluation "
            f"(status {evaluation.status}); fix the seed program or the fitness. Details:\n{details}"
        )

    # --- ask ----------------------------------------------------------------------------------------

    def reissue(self) -> list[Ask]:
        """The asks that were in flight when the run last stopped (asked again once, on resume)."""
        asks, self._reissue = self._reissue, []
        return asks

    def ask(self, n: int = 1) -> list[Ask]:
        """The next ``n`` proposals, their parents chosen now from the archive as it is."""
        asks = []
        for _ in range(n):
            seq = self.next_seq
            self.next_seq += 1
            island = seq % self.archive.islands
            interval = self.migration_interval
            migrant = self.archive.migrant_for(island) if interval and seq % interval == 0 else None
            ask = self.emitter.ask(
                seq=seq, rng=proposal_rng(self.seed, seq, 0), island=island, migrant=migrant
            )
            with self.store.transaction():
                self.store.record_ask(seq, ask.to_json(), self._next_event())
                self.notebook.record(seq)
            asks.append(ask)
        return asks

    # --- propose and admit --------------------------------------------------------------------------

    async def propose(self, ask: Ask) -> Outcome:
        """Run the operator of ``ask``; changes nothing in the run (``admit`` does).

        A built-in operator's child identical to a stored candidate is drawn again (it costs
        nothing); an LLM's is returned for ``admit`` to record as a duplicate, never asked
        again with the same prompt.

        Raises:
            evolve.llm.LLMStop: no further LLM call may be made (budget, offline replay, key).
        """
        operator, _ = self.emitter.arms[ask.arm]
        model = getattr(operator, "model", None)
        notes = await self.notebook.notes(ask.seq)
        for attempt in range(REDRAWS):
            rng = proposal_rng(self.seed, ask.seq, attempt, "operator")
            request = ask.request(self.archive, benchmark=self.benchmark, rng=rng, notes=notes)
            try:
                proposal = ask.child(await _run(operator, request))
            except OperatorRejected as error:
                return Rejection.raised(ask, operator.name, model, error)
            if model is not None or not (
                self.store.has_candidate(proposal.id)
                or self.novelty.structural_twin(proposal.files)
            ):
                twin = await self.novelty.embedding_twin(proposal.files)
                if twin is not None:
                    return Rejection.of(ask, proposal, twin.reason, duplicate_of=twin.id)
                return proposal
            if attempt + 1 < REDRAWS:  # a built-in operator: draw again, from the same archive
                ask = self.emitter.ask(
                    seq=ask.seq,
                    rng=proposal_rng(self.seed, ask.seq, attempt + 1),
                    island=ask.island,
                    migrant=ask.migrant,
                    attempt=attempt + 1,
                )
                operator, _ = self.emitter.arms[ask.arm]
                model = getattr(operator, "model", None)
        return Rejection(
            ask=ask,
            operator=operator.name,
            model=model,
            reason=f"{REDRAWS} draws in a row reproduced stored candidates",
            duplicate_of=proposal.id,
        )

    def admit(self, ask: Ask, outcome: Outcome) -> Candidate | Rejection:
        """Check a proposal (dedup, the edit check) and store it to be evaluated, or record its rejection."""
        norm = None
        if isinstance(outcome, Proposal):
            norm = normalized_hash(outcome.files)
            outcome = self._check(ask, outcome, norm)
        event = self._next_event()
        self.notebook.admitted(ask.seq)
        if isinstance(outcome, Rejection):
            self._record_rejection(outcome, event)
            return outcome
        with self.store.transaction():
            candidate = self.store.add_candidate(outcome, seq=ask.seq, norm_hash=norm)
            self.store.link_calls(outcome.prompt_hash, candidate.id)
            self.store.mark_event(ask.seq, "admitted", event)
        self._move(None, CandidateStatus.PROPOSED)
        return candidate

    def _check(self, ask: Ask, proposal: Proposal, norm: str) -> Outcome:
        """The one check every child passes before it is stored: new, inside its blocks, not a near twin."""
        if self.store.has_candidate(proposal.id):
            return Rejection.of(
                ask,
                proposal,
                f"the answer reproduces candidate {proposal.id[:8]} exactly; propose a different change",
                duplicate_of=proposal.id,
            )
        parent_files = self.store.candidate(ask.parents[0][0]).files
        try:
            check_edit(parent_files, proposal.files, self.benchmark.is_editable)
        except EditError as exc:
            return Rejection.of(ask, proposal, str(exc))
        equivalent = self.store.has_equivalent(norm)
        if equivalent is not None:
            return Rejection.of(
                ask,
                proposal,
                f"near-duplicate of {equivalent[:8]} (same code up to comments and whitespace)",
                duplicate_of=equivalent,
            )
        twin = self.novelty.structural_twin(proposal.files)
        if twin is not None:
            return Rejection.of(ask, proposal, twin.reason, duplicate_of=twin.id)
        return replace(proposal, island=ask.island)

    def _record_rejection(self, rejected: Rejection, event: int) -> None:
        ask = rejected.ask
        record_rejection(self.store, self.emitter, rejected, event)
        self._move(None, CandidateStatus.REJECTED)
        source = "" if rejected.reason.startswith(rejected.operator) else f"{ask.arm}: "
        log.info("#%d refused before evaluation: %s%s", ask.seq, source, rejected.reason[:200])

    # --- evaluate and tell --------------------------------------------------------------------------

    def start_evaluation(self, candidate: Candidate) -> Job:
        """Mark ``candidate`` as under evaluation and return what its evaluation is handed
        (``evolve.search.jobs``); refused once the harness files changed."""
        self._jobs.check_harness()
        if candidate.id not in self._evaluating:
            self._evaluating.add(candidate.id)
            if candidate.status != CandidateStatus.EVALUATING:  # it is when re-queued on resume
                with self.store.transaction():
                    self.store.set_status(candidate.id, CandidateStatus.EVALUATING)
                self._move(CandidateStatus.PROPOSED, CandidateStatus.EVALUATING)
        return self._jobs.job(candidate)

    def reevaluation(self, candidate: Candidate, sample: int, *, strict: bool = False) -> Job:
        """The job of ``candidate``'s extra evaluation ``sample`` (>= 1: the referee's or the
        auditor's; ``strict``: the fitness's strict mode); refused once the harness files changed."""
        self._jobs.check_harness()
        return self._jobs.job(candidate, sample, strict=strict)

    def tell(
        self,
        candidate: Candidate,
        evaluation: Evaluation,
        samples: Sequence[Evaluation] = (),
        *,
        state: Mapping[str, Any] | None = None,
        audit: AuditVerdict | None = None,
    ) -> AddResult | None:
        """Store an evaluation, offer it to the archive and teach the emitter, in one transaction.

        Args:
            candidate: an evaluated candidate (from ``admit``, ``seed_to_evaluate`` or a resume).
            evaluation: its verdict.
            samples: extra evaluations with other seeds (noise-aware selection), stored as
                rows of stage ``reevaluation`` before the verdict.
            state: extra ``state`` rows to write in the same transaction.
            audit: the auditor's verdict (``evolve.archive.referee.Auditor``), stored with the
                candidate; its strict re-evaluations are stored as rows of stage ``strict``.

        Returns:
            What the archive did (None for a failed evaluation).
        """
        seed = candidate.seq == 0
        islands = range(self.archive.islands) if seed else (candidate.island,)
        twin = None if seed else self.novelty.behavioural_twin(candidate.id, evaluation)
        if twin is not None:  # scored, but kept out of the archive
            islands, evaluation = (), twin.mark(evaluation)
        status = CandidateStatus.DONE if evaluation.ok else CandidateStatus.FAILED
        with self.store.transaction():
            self.store.set_status(candidate.id, status)
            for sample in samples:
                self.store.add_evaluation(candidate.id, replace(sample, stage=noise.REEVALUATION))
            if audit is not None:
                for sample in audit.strict:
                    self.store.add_evaluation(candidate.id, replace(sample, stage=STRICT))
                audit.record(self.store, candidate.id)
            self.store.add_evaluation(candidate.id, evaluation)
            for key, value in (state or {}).items():
                self.store.set_state(key, value)
            results = [self.archive.add(candidate.id, evaluation, island=i) for i in islands]
            kept_out = AddResult(status=AddStatus.NOT_ADDED, island=candidate.island)
            result = (results or [kept_out])[0] if evaluation.ok else None
            if not seed:
                parents = [  # the programs it was made from (inspirations were only shown)
                    pid for pid, role in candidate.parents if role != EdgeRole.INSPIRATION
                ]
                self.emitter.tell(arm_key(candidate.operator, candidate.model), result, parents)
                self.store.set_state("bandit", self.emitter.state.to_json())
                self.store.mark_event(candidate.seq, "told", self._next_event())
            started = (
                candidate.id in self._evaluating or candidate.status == CandidateStatus.EVALUATING
            )
            self._move(CandidateStatus.EVALUATING if started else CandidateStatus.PROPOSED, status)
            self._evaluating.discard(candidate.id)
            self.archive.record_stats(
                evaluated=self.evaluated, failures=self.failures, cost=self.cost()
            )
        return result


async def _run(operator: Operator, request: OperatorRequest) -> Proposal:
    """The child ``operator`` makes of ``request``; a failure of its own is an OperatorRejected."""
    try:
        return await operator.propose(request)
    except (OperatorRejected, EvolveError):
        raise
    except Exception as exc:  # e.g. a parent whose text an operator cannot read
        raise OperatorRejected(
            f"{operator.name} failed on its parents: {type(exc).__name__}: {exc}"
        ) from exc
