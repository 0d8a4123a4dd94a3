"""What every operator receives and returns: the request, the Operator protocol, rejection."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from evolve.harness.fitness import Benchmark
from evolve.types import Files, Parent, Proposal


@dataclass(frozen=True, kw_only=True)
class OperatorRequest:
    """Everything an operator may use to make one child.

    Attributes:
        parents: as many as the operator's ``arity`` (sampled by the emitter).
        inspirations: other elites to show (best and diverse), never edited directly.
        failures: what came of the latest proposals made from these parents (score or why
            they failed), newest first.
        notes: the run's research notebook as it was when the proposal was asked.
        benchmark: the problem (task text, editable files).
        rng: this proposal's own random stream (derived from the run seed and ``seq``).
        island: the island the child will live on.
        seq: the proposal's index in the run (also the sample index for response caching).
    """

    parents: Sequence[Parent]
    inspirations: Sequence[Parent] = ()
    failures: Sequence[str] = ()
    notes: str = ""
    benchmark: Benchmark
    rng: random.Random = field(default_factory=random.Random)
    island: int = 0
    seq: int = 0


class OperatorRejected(Exception):
    """The operator could not make a valid child (no usable edit, edit outside EVOLVE-BLOCKs...).

    The attempt is recorded as a ``rejected`` candidate with ``reason``; it costs no evaluation.
    Which arm and parents it came from is the engine's to know (``evolve.search.rejections.Rejection``).

    Args:
        reason: why, in words the model can act on (it is shown in later prompts).
        answer: the model's answer, when there was one.
        model: the model that answered.
        prompt_hash: the prompt's hash (links the rejection to its LLM calls).
        files: the attempted child's files, when there are any.
    """

    def __init__(
        self,
        reason: str,
        *,
        answer: str = "",
        model: str | None = None,
        prompt_hash: str | None = None,
        files: Files | None = None,
    ):
        super().__init__(reason)
        self.reason = reason
        self.answer = answer
        self.model = model
        self.prompt_hash = prompt_hash
        self.files: Files = dict(files or {})


@runtime_checkable
class Operator(Protocol):
    """Makes one child from ``arity`` parents. ``name`` is what the lineage and bandit record."""

    name: str
    arity: int

    async def propose(self, request: OperatorRequest) -> Proposal: ...
