"""Proposals that cost no evaluation: why each was refused, its record, and when a streak ends a run.

A ``Rejection`` is what ``evolve.search.engine.Engine`` returns instead of a candidate when an
operator gave nothing usable or its child failed the one edit check. ``record_rejection`` stores it
in one transaction: a candidate of status ``rejected`` whose evaluation names the reason
(the model sees it next time), the LLM calls that produced it linked to it, and the
emitter taught that its arm earned nothing. ``Streak`` is the driver's rule for a run
that keeps producing nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from evolve.operators.base import OperatorRejected
from evolve.search.emitters import Ask, Emitter
from evolve.store.database import Store
from evolve.types import CandidateStatus, EdgeRole, EvalStatus, Evaluation, Proposal, content_hash

MAX_IN_A_ROW = 50  # rejections in a row that end a run
CONVERGED_AFTER = 20  # answers in a row, each to a different prompt, that reproduced stored code


@dataclass(frozen=True, kw_only=True)
class Rejection:
    """A proposal that costs no evaluation: why, and everything needed to record it."""

    ask: Ask
    operator: str
    model: str | None
    reason: str
    answer: str = ""
    files: Mapping[str, str] | None = None
    prompt_hash: str | None = None
    duplicate_of: str | None = None  # the stored candidate an answer reproduced exactly

    @classmethod
    def of(
        cls, ask: Ask, proposal: Proposal, reason: str, duplicate_of: str | None = None
    ) -> Rejection:
        """The refusal of ``proposal`` (made for ``ask``) because of ``reason``."""
        return cls(
            ask=ask,
            operator=proposal.operator,
            model=proposal.model,
            reason=reason,
            files=proposal.files,
            prompt_hash=proposal.prompt_hash,
            duplicate_of=duplicate_of,
        )

    @classmethod
    def raised(
        cls, ask: Ask, operator: str, model: str | None, error: OperatorRejected
    ) -> Rejection:
        """The refusal ``operator`` raised for ``ask`` (``model``: the arm's, unless ``error`` names one)."""
        return cls(
            ask=ask,
            operator=operator,
            model=error.model or model,
            reason=error.reason,
            answer=error.answer,
            files=error.files or None,
            prompt_hash=error.prompt_hash,
        )


def record_rejection(store: Store, emitter: Emitter, rejected: Rejection, event: int) -> None:
    """Store ``rejected`` (asked, admitted and told at ``event``) and teach ``emitter``, in one transaction."""
    ask = rejected.ask
    arity = emitter.arms[ask.arm][0].arity if ask.arm in emitter.arms else 1
    proposal = Proposal(
        files=rejected.files or {},
        parents=ask.edges(EdgeRole.CROSSOVER if arity > 1 else EdgeRole.MUTATION),
        operator=rejected.operator,
        model=rejected.model,
        description=rejected.reason,
        prompt_hash=rejected.prompt_hash,
        island=ask.island,
    )
    rejected_id = content_hash({"<rejected>": f"{ask.seq}:{rejected.reason}:{rejected.answer}"})
    with store.transaction():
        store.add_candidate(
            proposal, seq=ask.seq, status=CandidateStatus.REJECTED, candidate_id=rejected_id
        )
        store.link_calls(rejected.prompt_hash, rejected_id)
        store.add_evaluation(
            rejected_id,
            Evaluation(
                status=EvalStatus.REJECTED,
                artifacts={
                    "error": rejected.reason,
                    "answer": rejected.answer[-4000:],
                    **({"twin": rejected.duplicate_of} if rejected.duplicate_of else {}),
                },
            ),
        )
        # a model's answer that was refused (a twin, a broken edit) is a child not kept
        parents = [pid for pid, _ in ask.parents] if rejected.answer.strip() else []
        emitter.tell(ask.arm, None, parents)
        store.set_state("bandit", emitter.state.to_json())
        store.record_ask(ask.seq, ask.to_json(), event)
        store.mark_event(ask.seq, "admitted", event)
        store.mark_event(ask.seq, "told", event)


class Streak:
    """Rejections in a row: the reason to end the run once they show it produces nothing new.

    Args:
        run_dir: named in the reason, where all the rejection reasons can be read.
    """

    def __init__(self, run_dir: Path | None = None) -> None:
        self.run_dir = run_dir
        self.in_a_row = 0
        self.duplicate_prompts: set[str | None] = set()

    def admitted(self) -> None:
        """A candidate was admitted: the streak is broken."""
        self.in_a_row = 0
        self.duplicate_prompts.clear()

    def rejected(self, rejected: Rejection) -> str | None:
        """Count ``rejected``; the reason the run should end, or None."""
        self.in_a_row += 1
        if rejected.duplicate_of is None:
            self.duplicate_prompts.clear()
        elif rejected.model is None:  # a built-in operator redrew many times and found nothing new
            return f"{rejected.reason} (operator {rejected.operator}); the search has converged"
        else:
            self.duplicate_prompts.add(rejected.prompt_hash)
            if len(self.duplicate_prompts) >= CONVERGED_AFTER:
                return (
                    f"{CONVERGED_AFTER} answers in a row, each to a different prompt, reproduced stored "
                    "candidates; the search has converged"
                )
        if self.in_a_row >= MAX_IN_A_ROW:
            where = self.run_dir if self.run_dir is not None else "<run directory>"
            return (
                f"{MAX_IN_A_ROW} proposals in a row were rejected; the last because: "
                f"{rejected.reason[:300]} (all reasons: python -m evolve.browse {where} stats)"
            )
        return None
