"""Typed settings of a run, built once from the config and passed down to the modules that use them.

Each dataclass is one config group (``search``, ``archive``, ``emitter``, ``operators``, ``audit``;
``llm`` and ``noise`` have theirs in their own modules) and
checks its own values, so an impossible value fails at start with a message naming the key
and what it accepts; ``RunSettings`` holds them all. ``evolve.launch.config.build_settings`` makes
them from a resolved config; a notebook user may make them directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from evolve.types import EvolveError

if TYPE_CHECKING:  # annotations only: the settings import nothing above the types
    from evolve.harness.fitness import Benchmark
    from evolve.llm.settings import LLMSettings


class ConfigError(EvolveError):
    """A configuration the run cannot use; the message names the fix."""


SAMPLERS = ("uniform", "rank")
SELECTIONS = ("bandit", "weights")
BUILTIN_OPERATORS = ("tweak", "crossover")


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _raise(problems: list[str]) -> None:
    if problems:
        raise ValueError("; ".join(problems))


@dataclass(frozen=True, kw_only=True)
class SearchSettings:
    """Budgets and concurrency of one run (the ``search`` config group).

    ``max_wall_s`` counts proposing time: from the seed program's verdict (its evaluation and
    noise calibration are not counted), and anew on each resume; evaluations in flight when it
    runs out still finish. ``max_proposals_in_flight`` bounds the proposals (LLM calls) made at
    once; None means evaluation slots + ``lookahead``.
    """

    max_candidates: int = 100
    max_wall_s: float | None = None
    lookahead: int = 0
    seed: int = 0
    migration_interval: int = 25
    progress: bool = True
    max_proposals_in_flight: int | None = None

    def proposals_in_flight(self, slots: int) -> int:
        """How many proposals may run at once with ``slots`` evaluation slots."""
        return self.max_proposals_in_flight or slots + self.lookahead

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.max_candidates, int) or self.max_candidates < 1:
            problems.append(
                f"search.max_candidates must be a positive integer, got {self.max_candidates!r}"
            )
        if self.max_wall_s is not None and not self.max_wall_s > 0:
            problems.append(
                f"search.max_wall_s must be positive seconds or null, got {self.max_wall_s!r}"
            )
        if not isinstance(self.lookahead, int) or self.lookahead < 0:
            problems.append(
                f"search.lookahead must be 0 or a positive integer, got {self.lookahead!r}"
            )
        if self.max_proposals_in_flight is not None and (
            not isinstance(self.max_proposals_in_flight, int) or self.max_proposals_in_flight < 1
        ):
            problems.append(
                "search.max_proposals_in_flight must be a positive integer or null (slots + lookahead), "
                f"got {self.max_proposals_in_flight!r}"
            )
        if not isinstance(self.migration_interval, int) or self.migration_interval < 0:
            problems.append(
                f"search.migration_interval must be 0 (no migration) or a positive integer, got {self.migration_interval!r}"
            )
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True, kw_only=True)
class NoveltySettings:
    """What counts as nothing new (``archive.novelty``); see ``evolve.search.novelty``.

    Attributes:
        names: refuse, before evaluation, a proposal that equals a stored candidate up to its
            functions' local variable names and its docstrings (a rename-only rewrite).
        constants: compare up to numeric constants too; only for a benchmark whose numbers
            do not change what a program computes (most do: leave it off).
        behaviour: keep out of the archive an evaluated candidate whose objective value and
            descriptors equal a stored candidate's bit for bit.
        embedding_model: a litellm embedding model (e.g. ``openai/text-embedding-3-small``);
            None: no embedding check.
        embedding_api_base: base URL of an OpenAI-compatible embedding server.
        embedding_api_key_env: environment variable holding the key to send; None: the
            provider's usual variable, or any key for a server at ``embedding_api_base``.
        embedding_threshold: cosine similarity at or above which code is refused as a
            near-twin of a stored candidate, in (0, 1].
    """

    names: bool = True
    constants: bool = False
    behaviour: bool = True
    embedding_model: str | None = None
    embedding_api_base: str | None = None
    embedding_api_key_env: str | None = None
    embedding_threshold: float = 0.99

    def __post_init__(self) -> None:
        problems = [
            f"archive.novelty.{name} must be true or false, got {getattr(self, name)!r}"
            for name in ("names", "constants", "behaviour")
            if not isinstance(getattr(self, name), bool)
        ]
        if not _number(self.embedding_threshold) or not 0 < self.embedding_threshold <= 1:
            problems.append(
                f"archive.novelty.embedding_threshold must lie in (0, 1], got {self.embedding_threshold!r}"
            )
        _raise(problems)

    @classmethod
    def from_config(cls, values: NoveltySettings | dict[str, Any] | None) -> NoveltySettings:
        """The settings from the ``archive.novelty`` mapping; unknown keys are errors naming the valid ones."""
        if isinstance(values, cls):
            return values
        values = dict(values or {})
        unknown = sorted(set(values) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(
                f"unknown key(s) {unknown} in archive.novelty; valid keys: "
                f"{', '.join(sorted(cls.__dataclass_fields__))}"
            )
        return cls(**values)


@dataclass(frozen=True, kw_only=True)
class ArchiveSettings:
    """The MAP-Elites archive (the ``archive`` config group); see ``evolve.archive.grid.Archive``.

    Attributes:
        islands: independent grids, bred separately and linked by ring migration (>= 1).
        sampler: how parents are drawn from an island: ``rank`` (better elites more likely)
            or ``uniform``.
        qd_offset: the QD score's baseline in oriented units (larger is better); None: the
            seed program's value.
        min_improvement: the smallest gain, relative to max(1, |incumbent|), that counts as
            improving a cell (rounding noise never replaces an elite).
        novelty: what counts as nothing new (``NoveltySettings``; a mapping in the config).
        split_depth: how many times a crowded cell may split, each axis halved each time
            (0: a fixed grid); see ``evolve.archive.grid``.
    """

    islands: int = 1
    sampler: str = "rank"
    qd_offset: float | None = None
    min_improvement: float = 1e-6
    novelty: NoveltySettings = NoveltySettings()
    split_depth: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "novelty", NoveltySettings.from_config(self.novelty))
        problems = []
        if not isinstance(self.split_depth, int) or self.split_depth < 0:
            problems.append(
                f"archive.split_depth must be an integer >= 0 (0: a fixed grid), got {self.split_depth!r}"
            )
        if not _positive_int(self.islands):
            problems.append(f"archive.islands must be an integer >= 1, got {self.islands!r}")
        if self.sampler not in SAMPLERS:
            problems.append(
                f"archive.sampler {self.sampler!r} unknown; choose one of {', '.join(SAMPLERS)}"
            )
        if self.qd_offset is not None and not _number(self.qd_offset):
            problems.append(f"archive.qd_offset must be a number or null, got {self.qd_offset!r}")
        if not _number(self.min_improvement) or self.min_improvement < 0:
            problems.append(
                f"archive.min_improvement must be 0 or a small positive fraction, got {self.min_improvement!r}"
            )
        _raise(problems)


@dataclass(frozen=True, kw_only=True)
class EmitterSettings:
    """How each proposal's operator is chosen (the ``emitter`` config group); see ``evolve.search.emitters``.

    Attributes:
        selection: ``bandit`` (discounted UCB whose prior is the operator weights) or
            ``weights`` (the weights as fixed probabilities).
        discount: per-update decay of the bandit's statistics, in (0, 1] (1: no forgetting).
        exploration: the UCB exploration constant (>= 0).
        inspirations: other elites shown with each request (>= 0).
    """

    selection: str = "bandit"
    discount: float = 0.99
    exploration: float = 0.5
    inspirations: int = 3

    def __post_init__(self) -> None:
        problems = []
        if self.selection not in SELECTIONS:
            problems.append(
                f"emitter.selection {self.selection!r} unknown; choose one of {', '.join(SELECTIONS)}"
            )
        if not _number(self.discount) or not 0 < self.discount <= 1:
            problems.append(f"emitter.discount must lie in (0, 1], got {self.discount!r}")
        if not _number(self.exploration) or self.exploration < 0:
            problems.append(f"emitter.exploration must be >= 0, got {self.exploration!r}")
        if not isinstance(self.inspirations, int) or self.inspirations < 0:
            problems.append(
                f"emitter.inspirations must be an integer >= 0, got {self.inspirations!r}"
            )
        _raise(problems)


@dataclass(frozen=True, kw_only=True)
class BuiltinWeights:
    """Weights of the built-in operators (``operators.builtin``); 0 turns one off."""

    tweak: float = 3.0
    crossover: float = 1.0

    def __post_init__(self) -> None:
        _raise(
            [
                f"operators.builtin.{name} must be a number >= 0 (0 turns it off), got {value!r}"
                for name in BUILTIN_OPERATORS
                if not _number(value := getattr(self, name)) or value < 0
            ]
        )

    def as_dict(self) -> dict[str, float]:
        """``{operator name: weight}``, as ``evolve.operators.catalog.builtin_operators`` takes it."""
        return {name: float(getattr(self, name)) for name in BUILTIN_OPERATORS}


@dataclass(frozen=True, kw_only=True)
class NoiseSettings:
    """The ``noise`` config group.

    Attributes:
        seeds: evaluations of the seed program at run start (calibration); 1 disables
            noise-aware selection entirely (plain comparison, one evaluation each).
        alpha: one-sided level: the largest accepted chance of promoting a challenger that
            is no better than the incumbent, over all looks of one comparison.
        close: a challenger whose p-value lies between its look's level and ``close`` is
            re-evaluated with more seeds; at ``close`` or above it is refused at once.
        schedule: a challenger's sample count at each look, strictly increasing from 1
            (e.g. ``[1, 4]``: one evaluation, then up to three more when close).
        level: confidence level of the stored intervals ``fitness_ci_low/high``.
        new_cell_seeds: samples taken of a challenger that lands in an empty cell (1: just
            the first). More make it a firmer incumbent: later challengers of its cell are
            then judged against a better estimate, so real gains pass more often.
        best_seeds: samples taken of a challenger whose first score would make it the run's
            best (the re-evaluation of would-be bests): its verdict is their mean, and their
            spread measures the noise of programs far from the seed (``Archive.noise_sd``).
    """

    seeds: int = 1
    alpha: float = 0.005
    close: float = 0.2
    schedule: tuple[int, ...] = (1, 4)
    level: float = 0.95
    new_cell_seeds: int = 1
    best_seeds: int = 3

    def __post_init__(self) -> None:
        object.__setattr__(self, "schedule", tuple(int(n) for n in self.schedule))
        if not isinstance(self.seeds, int) or self.seeds < 1:
            raise ValueError(
                f"noise.seeds must be an integer >= 1 (1 disables), got {self.seeds!r}"
            )
        if not 0 < self.alpha < 1:
            raise ValueError(f"noise.alpha must lie in (0, 1), got {self.alpha}")
        if not self.alpha <= self.close <= 1:
            raise ValueError(
                f"noise.close must lie in [noise.alpha, 1], got {self.close} (alpha {self.alpha})"
            )
        steps = self.schedule
        if (
            not steps
            or steps[0] != 1
            or any(b <= a for a, b in zip(steps, steps[1:], strict=False))
        ):
            raise ValueError(
                f"noise.schedule must start at 1 and increase strictly, e.g. [1, 4]; got {list(steps)}"
            )
        if not 0 < self.level < 1:
            raise ValueError(f"noise.level must lie in (0, 1), got {self.level}")
        if not isinstance(self.new_cell_seeds, int) or self.new_cell_seeds < 1:
            raise ValueError(
                f"noise.new_cell_seeds must be an integer >= 1, got {self.new_cell_seeds!r}"
            )
        if not isinstance(self.best_seeds, int) or self.best_seeds < 1:
            raise ValueError(f"noise.best_seeds must be an integer >= 1, got {self.best_seeds!r}")

    @property
    def enabled(self) -> bool:
        """Whether noise-aware selection runs (two or more calibration seeds)."""
        return self.seeds >= 2

    def look_alpha(self, n: int) -> float:
        """The level of the look made with ``n`` samples.

        ``alpha`` is split over the looks in proportion to their sample counts (``[1, 4]``:
        0.2 and 0.8 of it), so the levels sum to ``alpha`` (Bonferroni) and most of it goes to
        the look that has the most evidence.
        """
        reached = max((c for c in self.schedule if c <= n), default=self.schedule[0])
        return self.alpha * reached / sum(self.schedule)

    @classmethod
    def from_config(cls, node: Mapping[str, Any] | None) -> NoiseSettings:
        """Settings from the ``noise`` config node (missing: disabled); unknown keys are errors."""
        values = dict(node or {})
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(
                f"unknown key(s) {unknown} in noise; valid keys: {', '.join(sorted(names))}"
            )
        if "schedule" in values:
            values["schedule"] = tuple(values["schedule"])
        return cls(**values)


@dataclass(frozen=True, kw_only=True)
class AuditSettings:
    """The auditor stage (the ``audit`` config group); see ``evolve.archive.referee.Auditor``.

    Attributes:
        enabled: audit each candidate about to become the run's best with the static
            detectors (``evolve.harness.audit``); a flagged one is re-evaluated strictly
            before it may be promoted.
        strict_seeds: strict re-evaluations of a flagged candidate, each with another seed;
            their mean must still beat the best.
        review: when the run has a model (``llm.model``), it also reviews the candidate's
            change against the task's rules (``evolve.research.review``); a suspicious
            verdict counts like a static flag. No effect without a model.
    """

    enabled: bool = True
    strict_seeds: int = 1
    review: bool = True

    def __post_init__(self) -> None:
        problems = []
        for name in ("enabled", "review"):
            if not isinstance(getattr(self, name), bool):
                problems.append(f"audit.{name} must be true or false, got {getattr(self, name)!r}")
        if not _positive_int(self.strict_seeds):
            problems.append(
                f"audit.strict_seeds must be an integer >= 1, got {self.strict_seeds!r}"
            )
        _raise(problems)


@dataclass(frozen=True, kw_only=True)
class Alternative:
    """Another way to run a benchmark where fewer GPUs are visible (its config's ``alternatives:``).

    Attributes:
        gpus: the GPUs one evaluation needs this way (it fits where at least these are visible).
        args: the command-line arguments that replace the benchmark's choice (``benchmark=...``).
        why: what the user gets this way, in one line.
    """

    gpus: int
    args: tuple[str, ...]
    why: str


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """Everything a run is made of, typed and checked: built once from the config by ``build_settings``.

    Attributes:
        config: the resolved config as a plain dict (stored with the run, so a resume can rebuild it).
        benchmark: the problem, its fitness instantiated.
        search, archive, emitter, noise, builtin, llm, audit: the typed config groups.
        workers: evaluations at once (``search.workers``); None: one per GPU group or CPU core.
        backend: where evaluations run (``local`` or ``ray``).
        alternatives: the benchmark's own answers for machines with fewer GPUs, best first.
        dry_run: check everything, then stop before anything is written or evaluated.
    """

    config: dict[str, Any]
    benchmark: Benchmark
    search: SearchSettings
    archive: ArchiveSettings
    emitter: EmitterSettings
    noise: NoiseSettings
    builtin: BuiltinWeights
    llm: LLMSettings
    workers: int | None
    backend: str
    alternatives: tuple[Alternative, ...]
    dry_run: bool
    audit: AuditSettings = AuditSettings()
