"""Frozen dataclasses shared by every layer: candidates, proposals, evaluations, grid axes."""

from __future__ import annotations

import enum
import errno
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

Files = Mapping[str, str]


class EvolveError(Exception):
    """An error the user can fix; its message says how. Shown without a traceback."""


class InfrastructureFault(EvolveError):
    """The machine failed an evaluation (a full or unwritable disk, a worker that cannot start),
    not the candidate: the run ends naming the cause, and the candidate is evaluated again at resume."""


# errno values that mean the disk, not the program, failed
DISK_FAULTS = (errno.ENOSPC, errno.EDQUOT)


def content_hash(files: Files) -> str:
    """Return the id of a file set: the first 20 hex digits of a SHA-256 over paths and texts."""
    digest = hashlib.sha256(json.dumps(dict(sorted(files.items())), ensure_ascii=False).encode())
    return digest.hexdigest()[:20]


def _frozen(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping or {}))


def _rebuild(cls: type, kwargs: dict[str, Any]) -> Any:
    return cls(**kwargs)


class _Picklable:
    """Pickles frozen dataclasses whose mappings are read-only views (which do not pickle)."""

    def __reduce__(self) -> tuple[Any, ...]:
        values = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            values[f.name] = dict(value) if isinstance(value, MappingProxyType) else value
        return (_rebuild, (type(self), values))


class Direction(enum.StrEnum):
    """Whether larger or smaller objective values are better."""

    MAXIMIZE = "max"
    MINIMIZE = "min"


@dataclass(frozen=True, kw_only=True)
class Objective:
    """The scalar a search optimises: its name and direction."""

    name: str
    direction: Direction = Direction.MAXIMIZE

    def oriented(self, value: float) -> float:
        """Map a raw value so that larger is always better."""
        return value if self.direction == Direction.MAXIMIZE else -value

    def better(self, challenger: float, incumbent: float | None) -> bool:
        """True when ``challenger`` strictly beats ``incumbent`` (or there is none)."""
        return incumbent is None or self.oriented(challenger) > self.oriented(incumbent)


@dataclass(frozen=True, kw_only=True)
class Descriptor:
    """One feature dimension of the MAP-Elites grid: a fixed range cut into equal bins."""

    name: str
    low: float
    high: float
    bins: int

    def __post_init__(self) -> None:
        if not self.high > self.low:
            raise ValueError(
                f"descriptor {self.name!r}: high ({self.high}) must exceed low ({self.low})"
            )
        if self.bins < 1:
            raise ValueError(f"descriptor {self.name!r}: bins must be >= 1, got {self.bins}")

    def bin(self, value: float) -> int:
        """The bin of ``value``; values outside the range (and NaN) go to the nearest edge bin."""
        if math.isnan(value):
            return 0
        position = (value - self.low) / (self.high - self.low)
        return min(self.bins - 1, max(0, int(math.floor(position * self.bins))))


class EvalStatus(enum.StrEnum):
    """How an evaluation ended. Only ``OK`` carries a fitness that may enter the archive."""

    OK = "ok"
    INVALID = "invalid"  # ran, but the output breaks the problem's rules
    ERROR = "error"  # crashed (candidate or harness)
    TIMEOUT = "timeout"
    REJECTED = "rejected"  # refused before or during evaluation (integrity, cheating)


class CandidateStatus(enum.StrEnum):
    """Where a candidate is in its life: proposed -> evaluating -> done | failed | rejected."""

    PROPOSED = "proposed"
    EVALUATING = "evaluating"
    DONE = "done"
    FAILED = "failed"
    REJECTED = "rejected"


class EdgeRole(enum.StrEnum):
    """Why a parent is linked to a child in the lineage."""

    MUTATION = "mutation"
    CROSSOVER = "crossover"
    INSPIRATION = "inspiration"
    MIGRATION = "migration"


class AddStatus(enum.IntEnum):
    """What ``Archive.add`` did with an evaluated candidate (pyribs' vocabulary)."""

    NOT_ADDED = 0
    IMPROVE_EXISTING = 1
    NEW = 2


@dataclass(frozen=True, kw_only=True)
class Proposal(_Picklable):
    """A candidate as an operator produced it, before it has an id or a place in the store."""

    files: Files
    parents: tuple[tuple[str, EdgeRole], ...] = ()
    operator: str
    model: str | None = None
    description: str = ""
    prompt_hash: str | None = None
    island: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", _frozen(self.files))

    @property
    def id(self) -> str:
        return content_hash(self.files)


@dataclass(frozen=True, kw_only=True)
class Candidate(_Picklable):
    """A stored program: a set of files, where it came from and where it stands."""

    id: str
    seq: int
    files: Files
    operator: str
    model: str | None = None
    description: str = ""
    prompt_hash: str | None = None
    island: int = 0
    status: CandidateStatus = CandidateStatus.PROPOSED
    parents: tuple[tuple[str, EdgeRole], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", _frozen(self.files))


@dataclass(frozen=True, kw_only=True)
class Evaluation(_Picklable):
    """The harness's verdict on one candidate.

    ``fitness`` is set only when ``status`` is OK. ``artifacts`` holds text fed back to
    operators (errors, tracebacks, profiler summaries); ``metrics`` holds numbers.
    """

    status: EvalStatus
    fitness: float | None = None
    metrics: Mapping[str, Any] = field(default_factory=dict)
    descriptors: Mapping[str, float] = field(default_factory=dict)
    artifacts: Mapping[str, str] = field(default_factory=dict)
    stage: str = "full"
    wall_s: float = 0.0
    seeds: tuple[int, ...] = ()
    hardware: str = ""

    def __post_init__(self) -> None:
        for name in ("metrics", "descriptors", "artifacts"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))
        if self.status == EvalStatus.OK and (
            self.fitness is None or not math.isfinite(self.fitness)
        ):
            raise ValueError(f"an OK evaluation needs a finite fitness, got {self.fitness!r}")

    @property
    def ok(self) -> bool:
        return self.status == EvalStatus.OK


@dataclass(frozen=True, kw_only=True)
class AddResult:
    """The outcome of offering an evaluated candidate to the archive.

    ``improvement`` is the gain over the cell's previous elite in the objective's
    direction (0.0 for a new cell or a candidate not added); emitters learn from it.
    """

    status: AddStatus
    improvement: float = 0.0
    island: int = 0
    cell: str | None = None


@dataclass(frozen=True, kw_only=True)
class Parent:
    """A stored candidate with its latest evaluation and its cell in the grid."""

    candidate: Candidate
    evaluation: Evaluation | None = None
    cell: str | None = None


@dataclass(frozen=True, kw_only=True)
class Job:
    """One evaluation to run: a candidate's files and the context handed to the fitness.

    ``strict``: the auditor's stricter re-evaluation of a flagged candidate (``EvalContext.strict``).
    """

    candidate_id: str
    files: Files
    seed: int
    timeout_s: float
    strict: bool = False
