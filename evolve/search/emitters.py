"""Chooses parents, operator and model for each proposal, and learns from what the archive did.

Arms are operators (an LLM operator is bound to one model, so arms are model x operator).
Selection is either by fixed weights or by a discounted UCB bandit whose prior is the
weights; its state is plain JSON, saved with every result so that a resumed run continues
with the same statistics. The emitter only chooses: ``ask`` fixes everything the operator will
see (an ``Ask``, plain data stored with the run); the engine hands the operator the
``Ask.request`` and keeps its answer as ``Ask.child``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from evolve.archive.grid import CURIOSITY_KEPT, CURIOSITY_NOT_KEPT, Archive
from evolve.harness.fitness import Benchmark
from evolve.operators.base import Operator, OperatorRequest
from evolve.research.notebook import sibling_notes
from evolve.types import AddResult, AddStatus, EdgeRole, Proposal

SELECTIONS = ("bandit", "weights")


def arm_key(operator: str, model: str | None) -> str:
    """The bandit's name for an operator: ``name``, or ``name@model`` for one bound to a model."""
    return f"{operator}@{model}" if model else operator


def reward(result: AddResult | None, scale: float) -> float:
    """1 for a new cell, 0.5-1 for an improvement (by its size), 0 otherwise (failures too)."""
    if result is None or result.status == AddStatus.NOT_ADDED:
        return 0.0
    if result.status == AddStatus.NEW:
        return 1.0
    return 0.5 + 0.5 * math.tanh(result.improvement / scale) if scale > 0 else 0.75


@dataclass
class BanditState:
    """Discounted counts and reward sums per arm, the running improvement scale, and each
    parent's curiosity score (``evolve.archive.grid``: +1 per child kept, -0.5 per child not kept)."""

    counts: dict[str, float] = field(default_factory=dict)
    rewards: dict[str, float] = field(default_factory=dict)
    improvement_scale: float = 0.0
    improvements_seen: int = 0
    curiosity: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "counts": self.counts,
            "rewards": self.rewards,
            "improvement_scale": self.improvement_scale,
            "improvements_seen": self.improvements_seen,
            "curiosity": self.curiosity,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> BanditState:
        return cls(**data) if data else cls()


@dataclass(frozen=True, kw_only=True)
class Ask:
    """One proposal to make, fixed when it starts: what its operator sees, as plain data.

    Stored with the run (``schedule``), so a proposal in flight when a run is killed is
    asked again with the same prompt on resume, and its recorded answer is reused.
    """

    seq: int
    island: int
    arm: str
    parents: tuple[tuple[str, str | None], ...]  # (candidate id, cell)
    migrant: str | None = None
    inspirations: tuple[tuple[str, str | None], ...] = ()
    failures: tuple[str, ...] = ()
    attempt: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Ask:
        return cls(
            **{
                **data,
                "parents": tuple(tuple(p) for p in data["parents"]),
                "inspirations": tuple(tuple(p) for p in data["inspirations"]),
                "failures": tuple(data["failures"]),
            }
        )

    def edges(self, role: EdgeRole) -> tuple[tuple[str, EdgeRole], ...]:
        """The lineage edges of a child of these parents (the migrant's edge: ``migration``)."""
        return tuple((pid, self._role(pid, role)) for pid, _ in self.parents)

    def _role(self, parent: str, role: EdgeRole) -> EdgeRole:
        return EdgeRole.MIGRATION if parent == self.migrant else role

    def request(
        self, archive: Archive, *, benchmark: Benchmark, rng: random.Random, notes: str = ""
    ) -> OperatorRequest:
        """What the operator of this ask is handed: its parents and inspirations as stored in
        ``archive``, ``rng`` (the operator's own stream) and ``notes`` (the run's notebook as
        recorded for this ask, ``evolve.research.notebook``)."""
        return OperatorRequest(
            parents=[archive.parent(pid, cell) for pid, cell in self.parents],
            inspirations=[archive.parent(pid, cell) for pid, cell in self.inspirations],
            failures=self.failures,
            notes=notes,
            benchmark=benchmark,
            rng=rng,
            island=self.island,
            seq=self.seq,
        )

    def child(self, proposal: Proposal) -> Proposal:
        """The operator's ``proposal`` as this ask's child: on its island, the migrant's edge ``migration``."""
        parents = tuple((pid, self._role(pid, role)) for pid, role in proposal.parents)
        return replace(proposal, parents=parents, island=self.island)


class Emitter:
    """Chooses each proposal's arm and parents, and learns from their outcomes.

    Args:
        archive: where parents and inspirations come from.
        operators: (operator, weight) pairs; weights are selection probabilities (``weights``)
            or the bandit's prior (``bandit``).
        selection: ``bandit`` or ``weights``.
        discount: per-update decay of the bandit's statistics (1.0 = no forgetting).
        exploration: the UCB exploration constant.
        inspirations: how many other elites each request shows.
    """

    def __init__(
        self,
        *,
        archive: Archive,
        operators: Sequence[tuple[Operator, float]],
        selection: str = "bandit",
        discount: float = 0.99,
        exploration: float = 0.5,
        inspirations: int = 3,
    ) -> None:
        if not operators:
            raise ValueError("no operators configured")
        if selection not in SELECTIONS:
            raise ValueError(
                f"emitter.selection {selection!r} unknown; choose one of {', '.join(SELECTIONS)}"
            )
        self.archive = archive
        self.arms = {
            arm_key(op.name, getattr(op, "model", None)): (op, float(weight))
            for op, weight in operators
        }
        if any(weight <= 0 for _, weight in self.arms.values()):
            raise ValueError("operator weights must be positive")
        self.selection = selection
        self.discount = discount
        self.exploration = exploration
        self.n_inspirations = inspirations
        self.state = BanditState()

    # --- choosing ---------------------------------------------------------------------------------

    def choose(self, rng: random.Random) -> str:
        keys = sorted(self.arms)
        weights = [self.arms[k][1] for k in keys]
        if self.selection == "weights":
            return rng.choices(keys, weights=weights)[0]
        total_weight = sum(weights)
        untried = [k for k in keys if self.state.counts.get(k, 0.0) < 1e-9]
        if untried:
            return rng.choices(untried, weights=[self.arms[k][1] for k in untried])[0]
        total = sum(self.state.counts.values())

        def score(key: str) -> float:
            n = self.state.counts[key]
            prior = self.arms[key][1] / total_weight
            return self.state.rewards[key] / n + self.exploration * math.sqrt(
                prior * math.log(total + 1) / n
            )

        best = max(score(k) for k in keys)
        return rng.choice([k for k in keys if score(k) >= best - 1e-12])

    def ask(
        self,
        *,
        seq: int,
        rng: random.Random,
        island: int,
        migrant: str | None = None,
        attempt: int = 0,
    ) -> Ask:
        """Choose the arm, parents, inspirations and failure notes of proposal ``seq`` from the archive as it is now.

        A ``migrant`` (best elite of the neighbouring island) becomes the first parent.
        """
        key = self.choose(rng)
        operator = self.arms[key][0]
        parents: list[tuple[str, str | None]] = list(
            self.archive.sample_cells(  # crossover parents apart: neither descends from the other
                operator.arity,
                rng,
                island=island,
                curiosity=self.state.curiosity,
                apart=operator.arity > 1,
                first=migrant,
            )
        )
        exclude = [pid for pid, _ in parents]
        inspirations = self.archive.inspiration_cells(
            self.n_inspirations, rng, island=island, exclude=exclude
        )
        return Ask(
            seq=seq,
            island=island,
            arm=key,
            parents=tuple(parents),
            migrant=migrant,
            inspirations=tuple(inspirations),
            failures=tuple(sibling_notes(self.archive.store, exclude)),
            attempt=attempt,
        )

    # --- learning ---------------------------------------------------------------------------------

    def tell(self, key: str, result: AddResult | None, parents: Sequence[str] = ()) -> None:
        """Update the bandit with the outcome of one proposal (None: failed or rejected) and
        the curiosity scores of its ``parents`` (kept: it entered the archive)."""
        kept = result is not None and result.status != AddStatus.NOT_ADDED
        for parent in dict.fromkeys(parents):
            score = self.state.curiosity.get(parent, 0.0)
            self.state.curiosity[parent] = score + (CURIOSITY_KEPT if kept else CURIOSITY_NOT_KEPT)
        if key not in self.arms:
            return  # an arm from an earlier configuration of a resumed run
        if (
            result is not None
            and result.status == AddStatus.IMPROVE_EXISTING
            and result.improvement > 0
        ):
            seen = self.state.improvements_seen + 1
            self.state.improvement_scale += (
                result.improvement - self.state.improvement_scale
            ) / seen
            self.state.improvements_seen = seen
        for arm in self.arms:
            self.state.counts[arm] = self.state.counts.get(arm, 0.0) * self.discount
            self.state.rewards[arm] = self.state.rewards.get(arm, 0.0) * self.discount
        self.state.counts[key] += 1.0
        self.state.rewards[key] += reward(result, self.state.improvement_scale)
