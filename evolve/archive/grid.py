"""MAP-Elites grids (one per island) over the store: add, sample parents and inspirations, QD stats.

The grid's cells come from the benchmark's descriptors, each a fixed range cut into bins;
values outside a range go to its edge bin. With ``split_depth`` > 0 the resolution adapts
where candidates crowd: a candidate reaching an occupied cell splits it (each axis halved)
and takes its own sub-cell, down to ``split_depth`` levels, below which cells are competed
for as usual. A cell's elite keeps its address when the cell splits, and sub-cells extend
it ("2,3" -> "2,3/0,1" -> "2,3/0,1/1,1"), so an address names the same region for the whole
run and resume and browse see the same cells; which cells are split follows from the
stored addresses. Each island keeps its own grid; the seed program is placed on every island. Elites live in memory for speed and in
the ``elites`` table for durability; both change in the same transaction as the
evaluation that caused the change.

Parents are drawn by rank (or uniformly) times a curiosity weight: an elite's curiosity
score (Cully & Demiris 2018, "Quality and Diversity Optimization: A Unifying Modular
Framework", IEEE TEC 22(2)) gains 1 for each child kept in the archive and loses 0.5 for each
child not kept (the emitter keeps the scores), and a negative score divides the elite's
weight by ``1 + |score|``, so a plateau edited again and again without result yields to
other elites, and children that land again restore it. A positive score adds nothing: rank
already favours quality, and weighting by past productivity too sent 41% of a 200-candidate
scripted circle-packing run's proposals to its three most prolific parents, the seed above
all (``scripts/prompt_report.py``; 19% as shipped, 16% before curiosity). Crossover parents are drawn ``apart``: neither descends
from the other (and, from distinct cells, they behave differently by at least one bin).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evolve.query.edges import PARENT_ROLES
from evolve.settings import NoveltySettings
from evolve.store.database import Store
from evolve.types import (
    AddResult,
    AddStatus,
    Descriptor,
    Evaluation,
    Objective,
    Parent,
)

SAMPLERS = ("uniform", "rank")
CURIOSITY_KEPT, CURIOSITY_NOT_KEPT = 1.0, -0.5  # Cully & Demiris 2018's curiosity score updates
_KIN_SQL = """
WITH RECURSIVE up(id) AS (SELECT ? UNION SELECT e.parent FROM edges e JOIN up ON e.child = up.id
    WHERE e.role IN ({roles})),
down(id) AS (SELECT ? UNION SELECT e.child FROM edges e JOIN down ON e.parent = down.id
    WHERE e.role IN ({roles}))
SELECT id FROM up UNION SELECT id FROM down
"""


def describe_cell(cell: str | None, axes: Sequence[Mapping[str, Any]] | None) -> str:
    """``cell`` with its axes named by their ranges: ``radius_std 0.01-0.02, wall_fraction 0.5-0.6667``
    (a split cell, ``1,3/0,1``, by its narrower ranges), the one way cells are named."""
    if not cell:
        return ""
    levels = [level.split(",") for level in cell.split("/")]
    valid = bool(axes) and all(
        len(parts) == len(axes) and all(p.strip().isdigit() for p in parts) for parts in levels
    )
    if not valid:
        names = " x ".join(str(a["name"]) for a in axes or ())
        return f"{cell} ({names})" if names else cell
    shown = []
    for k, axis in enumerate(axes):  # type: ignore[arg-type]
        bins = int(axis["bins"])
        width = (float(axis["high"]) - float(axis["low"])) / bins
        low = float(axis["low"]) + int(levels[0][k]) * width
        for sub in levels[1:]:  # a split cell: each level halves the bin
            width /= 2
            low += int(sub[k]) * width
        shown.append(f"{axis['name']} {low:.4g}-{low + width:.4g}")
    return ", ".join(shown)


@dataclass
class Elite:
    candidate_id: str
    value: float  # raw objective value


class Archive:
    """MAP-Elites archive with islands.

    Args:
        store: the run's store (the archive reads and writes its ``elites`` table).
        objective: what is optimised.
        descriptors: the grid's axes; none gives a single cell per island.
        islands: number of islands (>= 1).
        sampler: ``uniform`` over an island's elites or ``rank`` (better elites more likely).
        qd_offset: the baseline of ``qd_score``, in oriented units (larger is better); None
            means the seed program's. Each elite adds how far it is above it (0 if not), so
            the QD score never falls as cells fill, whether the objective is maximised or
            minimised; it rises with each elite that beats the baseline.
        min_improvement: the smallest gain that counts as an improvement, relative to the
            incumbent's magnitude (absolute when it is below 1): a challenger must beat the
            incumbent by more than ``min_improvement * max(1, |incumbent|)``. Rounding noise
            (gains of 1e-15) never replaces an elite or makes a new best.
        novelty: what counts as nothing new (``evolve.search.novelty``, run by the engine): a
            mapping of ``NoveltySettings`` fields, or the settings themselves.
        split_depth: how many times a crowded cell may split (0: a fixed grid).
    """

    def __init__(
        self,
        *,
        store: Store,
        objective: Objective,
        descriptors: Sequence[Descriptor] = (),
        islands: int = 1,
        sampler: str = "rank",
        qd_offset: float | None = None,
        min_improvement: float = 1e-6,
        novelty: NoveltySettings | dict | None = None,
        split_depth: int = 0,
    ) -> None:
        if islands < 1:
            raise ValueError(f"archive.islands must be >= 1, got {islands}")
        if sampler not in SAMPLERS:
            raise ValueError(
                f"archive.sampler {sampler!r} unknown; choose one of {', '.join(SAMPLERS)}"
            )
        if not min_improvement >= 0:
            raise ValueError(
                f"archive.min_improvement must be 0 or a small positive fraction, got {min_improvement!r}"
            )
        self.min_improvement = float(min_improvement)
        self.novelty = NoveltySettings.from_config(novelty)
        if not isinstance(split_depth, int) or split_depth < 0:
            raise ValueError(f"archive.split_depth must be an integer >= 0, got {split_depth!r}")
        self.split_depth = split_depth
        self.store = store
        self.objective = objective
        self.descriptors = tuple(descriptors)
        self.islands = islands
        self.sampler = sampler
        self.qd_offset = qd_offset
        self._seed_value: float | None = None
        self.cells_per_island = (
            math.prod(d.bins for d in self.descriptors) if self.descriptors else 1
        )
        self._grid: list[dict[str, Elite]] = [{} for _ in range(islands)]
        self._split: list[set[str]] = [set() for _ in range(islands)]  # cells that have split
        self._ranked: dict[int | None, list[tuple[int, str, Elite]]] = {}  # elites(), by island
        # Noise-aware selection (evolve.archive.noise.NoiseJudge): judge(challenger, incumbent id,
        # incumbent value) -> whether the challenger replaces the incumbent; None = plain comparison.
        self.judge: Callable[[Evaluation, str, float], bool] | None = None
        # The sd of repeated evaluations of one program (evolve.archive.referee measures it); None: not measured.
        self.noise_sd: float | None = None
        for island, cell, candidate_id, value in store.elites():
            if island < islands:
                self._put(island, cell, Elite(candidate_id, value))

    # --- placement ---------------------------------------------------------------------------

    def cell_of(self, evaluation: Evaluation, depth: int = 0) -> str:
        """The cell key ("3,0,7") of an evaluation's descriptor values; ``depth`` > 0: its sub-cell that deep."""
        if not self.descriptors:
            return "0"
        positions = []
        for axis in self.descriptors:
            value = evaluation.descriptors.get(axis.name)
            if value is None:
                raise KeyError(
                    f"the fitness returned no descriptor {axis.name!r} (it returned {sorted(evaluation.descriptors)}); "
                    "every declared descriptor must be in Evaluation.descriptors"
                )
            value = float(value)
            positions.append(
                0.0 if math.isnan(value) else (value - axis.low) / (axis.high - axis.low)
            )
        levels = []
        for level in range(depth + 1):
            bins = []
            for position, axis in zip(positions, self.descriptors, strict=True):
                count = axis.bins * 2**level
                index = min(count - 1, max(0, math.floor(position * count)))
                bins.append(str(index if level == 0 else index % 2))
            levels.append(",".join(bins))
        return "/".join(levels)

    def leaf(self, evaluation: Evaluation, island: int) -> str:
        """The unsplit cell of ``island`` that an evaluation falls in (its base cell on a fixed grid)."""
        depth, cell = 0, self.cell_of(evaluation)
        while cell in self._split[island]:
            depth += 1
            cell = self.cell_of(evaluation, depth)
        return cell

    def rival(self, evaluation: Evaluation, island: int) -> Elite | None:
        """The elite an evaluation would have to beat on ``island``; None when it would take a cell of its own."""
        cell = self.leaf(evaluation, island)
        if cell.count("/") < self.split_depth:
            return None  # an occupied cell this shallow splits instead
        return self._grid[island].get(cell)

    def add(self, candidate_id: str, evaluation: Evaluation, *, island: int) -> AddResult:
        """Offer an evaluated candidate to its island's grid (call inside a store transaction)."""
        if not evaluation.ok:
            return AddResult(status=AddStatus.NOT_ADDED, island=island)
        assert evaluation.fitness is not None
        cell = self.leaf(evaluation, island)
        incumbent = self._grid[island].get(cell)
        if incumbent is not None and cell.count("/") < self.split_depth:
            cell = self.cell_of(evaluation, cell.count("/") + 1)  # the crowded cell splits
            incumbent = None
        if incumbent is not None and not self._beats(evaluation, incumbent):
            return AddResult(status=AddStatus.NOT_ADDED, island=island, cell=cell)
        self._put(island, cell, Elite(candidate_id, evaluation.fitness))
        self.store.put_elite(island, cell, candidate_id, evaluation.fitness)
        if incumbent is None:
            return AddResult(status=AddStatus.NEW, island=island, cell=cell)
        gain = self.objective.oriented(evaluation.fitness) - self.objective.oriented(
            incumbent.value
        )
        return AddResult(
            status=AddStatus.IMPROVE_EXISTING, improvement=gain, island=island, cell=cell
        )

    def _put(self, island: int, cell: str, elite: Elite) -> None:
        """Place an elite in memory; every cell its address extends has split."""
        self._grid[island][cell] = elite
        self._ranked.clear()
        levels = cell.split("/")
        self._split[island].update("/".join(levels[:k]) for k in range(1, len(levels)))

    def _beats(self, evaluation: Evaluation, incumbent: Elite) -> bool:
        assert evaluation.fitness is not None
        if self.judge is not None:
            return self.judge(evaluation, incumbent.candidate_id, incumbent.value)
        return self.improves(evaluation.fitness, incumbent.value)

    def improves(self, value: float, over: float) -> bool:
        """Whether ``value`` beats ``over`` by more than the stated tolerance (``min_improvement``)."""
        gain = self.objective.oriented(value) - self.objective.oriented(over)
        return gain > self.min_improvement * max(1.0, abs(over))

    def beyond_noise(self, value: float, over: float) -> bool:
        """Whether ``value`` beats ``over`` beyond the tolerance and twice the measured noise
        (``noise_sd``): what a new best must do to be called one."""
        gain = self.objective.oriented(value) - self.objective.oriented(over)
        return self.improves(value, over) and gain > 2 * (self.noise_sd or 0.0)

    def incumbent(self, island: int, cell: str) -> Elite | None:
        """The elite of ``cell`` on ``island``, or None when the cell is empty."""
        return self._grid[island].get(cell)

    # --- sampling ------------------------------------------------------------------------------

    def elites(self, island: int | None = None) -> list[tuple[int, str, Elite]]:
        """(island, cell, elite) for one island or all, best first (sorted once per change)."""
        rows = self._ranked.get(island)
        if rows is None:
            islands = range(self.islands) if island is None else (island,)
            rows = [(i, cell, elite) for i in islands for cell, elite in self._grid[i].items()]
            rows.sort(key=lambda row: (-self.objective.oriented(row[2].value), row[0], row[1]))
            self._ranked[island] = rows
        return list(rows)

    def parent(self, candidate_id: str, cell: str | None = None) -> Parent:
        """A stored candidate as a parent or inspiration, with its latest evaluation."""
        return Parent(
            candidate=self.store.candidate(candidate_id),
            evaluation=self.store.evaluation(candidate_id),
            cell=cell,
        )

    def sample_parents(self, count: int, rng: random.Random, *, island: int) -> list[Parent]:
        """``count`` parents from an island, from distinct cells when the island has enough."""
        return [
            self.parent(cid, cell) for cid, cell in self.sample_cells(count, rng, island=island)
        ]

    def sample_cells(
        self,
        count: int,
        rng: random.Random,
        *,
        island: int,
        curiosity: Mapping[str, float] | None = None,
        apart: bool = False,
        first: str | None = None,
    ) -> list[tuple[str, str]]:
        """(candidate id, cell) of ``count`` parents, as ``sample_parents`` chooses them.

        Parents come from distinct cells of ``island``, each drawn by the sampler times its
        ``curiosity`` weight (module docstring); when the island has too few (a converged
        island holding one elite), the rest come from the other islands' elites, so a
        crossover gets two different parents once the whole archive holds two. ``apart``:
        no parent is an ancestor or a descendant of another. ``first``: the first parent,
        fixed (a migrant; its cell is None). Where no parent is left to draw, the first is
        repeated (a crossover operator then refuses the pair).
        """
        ranked = self.elites(island) or self.elites()
        if not ranked:
            raise LookupError("the archive is empty: evaluate the seed program first")
        others = [row for row in self.elites() if row[0] != island]
        lonely: set[str] = set()  # first parents drawn that had no partner apart
        fallback: list[tuple[str, str | None]] = []
        while True:
            picked: list[tuple[str, str | None]] = [] if first is None else [(first, None)]
            excluded = set(lonely)
            if first is not None:
                excluded = self.kin(first) if apart else {first}
            while len(picked) < count:
                pool = [r for r in ranked if r[2].candidate_id not in excluded] or [
                    r for r in others if r[2].candidate_id not in excluded
                ]
                if not pool:
                    break
                _, cell, elite = self._draw(pool, 1, rng, curiosity)[0]
                picked.append((elite.candidate_id, cell))
                excluded |= self.kin(elite.candidate_id) if apart else {elite.candidate_id}
            fallback = fallback or picked
            if len(picked) == count:
                return picked  # type: ignore[return-value]
            if first is not None or not apart or not picked:
                return fallback + [fallback[0]] * (count - len(fallback))  # type: ignore[return-value]
            lonely.add(picked[0][0])  # draw another first parent, one with a partner apart

    def kin(self, candidate_id: str) -> set[str]:
        """``candidate_id`` with every candidate it descends from and every one descending from it."""
        roles = ", ".join("?" * len(PARENT_ROLES))
        rows = self.store.conn.execute(
            _KIN_SQL.format(roles=roles), (candidate_id, *PARENT_ROLES, candidate_id, *PARENT_ROLES)
        )
        return {row[0] for row in rows}

    def _draw(
        self,
        ranked: list[tuple[int, str, Elite]],
        count: int,
        rng: random.Random,
        curiosity: Mapping[str, float] | None = None,
    ) -> list[tuple[int, str, Elite]]:
        """``count`` rows of ``ranked`` (best first) by the sampler times their curiosity
        weight, without repeats until all are drawn."""
        if not ranked or count <= 0:
            return []
        weights = [1.0] * len(ranked)
        if self.sampler == "rank":
            weights = [1.0 / (rank + 1) for rank in range(len(ranked))]
        if curiosity:
            scores = [curiosity.get(elite.candidate_id, 0.0) for _, _, elite in ranked]
            weights = [w / (1.0 - min(0.0, s)) for w, s in zip(weights, scores, strict=True)]
        picked: list[tuple[int, str, Elite]] = []
        pool = list(zip(ranked, weights, strict=True))
        while len(picked) < count:
            if not pool:  # fewer rows than wanted: allow repeats
                pool = list(zip(ranked, weights, strict=True))
            index = rng.choices(range(len(pool)), weights=[w for _, w in pool])[0]
            picked.append(pool.pop(index)[0])
        return picked

    def inspirations(
        self, count: int, rng: random.Random, *, island: int, exclude: Sequence[str] = ()
    ) -> list[Parent]:
        """The island's best elite plus elites of other cells chosen at random (never ``exclude``)."""
        chosen = self.inspiration_cells(count, rng, island=island, exclude=exclude)
        return [self.parent(cid, cell) for cid, cell in chosen]

    def inspiration_cells(
        self, count: int, rng: random.Random, *, island: int, exclude: Sequence[str] = ()
    ) -> list[tuple[str, str]]:
        """(candidate id, cell) of the inspirations ``inspirations`` chooses (nothing read)."""
        ranked = [row for row in self.elites(island) if row[2].candidate_id not in exclude]
        if not ranked or count <= 0:
            return []
        chosen = [ranked[0]]
        others = ranked[1:]
        chosen += rng.sample(others, min(count - 1, len(others)))
        return [(elite.candidate_id, cell) for _, cell, elite in chosen]

    def best(self) -> tuple[str, float] | None:
        """(candidate id, objective value) of the best elite over all islands."""
        rows = self.elites()
        return (rows[0][2].candidate_id, rows[0][2].value) if rows else None

    def migrant_for(self, island: int) -> str | None:
        """Ring migration: the best elite of the previous island, as a parent for ``island``."""
        if self.islands < 2:
            return None
        source = self.elites((island - 1) % self.islands)
        return source[0][2].candidate_id if source else None

    # --- statistics ----------------------------------------------------------------------------

    def stats(self) -> dict[str, float]:
        """Coverage (base cells holding an elite over all base cells, across islands), QD score and best value."""
        filled = sum(len({cell.split("/")[0] for cell in grid}) for grid in self._grid)
        coverage = filled / (self.cells_per_island * self.islands)
        offset = self._qd_baseline()
        qd_score = (
            sum(
                max(0.0, self.objective.oriented(elite.value) - offset)
                for grid in self._grid
                for elite in grid.values()
            )
            if offset is not None
            else 0.0
        )
        best = self.best()
        return {
            "coverage": coverage,
            "qd_score": qd_score,
            "best": best[1] if best else float("nan"),
        }

    def _qd_baseline(self) -> float | None:
        """``qd_offset``, or the seed program's oriented objective (None before it is evaluated)."""
        if self.qd_offset is not None:
            return self.qd_offset
        if self._seed_value is None:
            seed = self.store.seed_evaluation()
            if seed is None or not seed.ok:
                return None
            self._seed_value = self.objective.oriented(seed.fitness)
        return self._seed_value

    def record_stats(self, *, evaluated: int, failures: int, cost: float) -> None:
        """Append one row to the ``stats`` time series (call inside a store transaction)."""
        self.store.add_stats(evaluated=evaluated, failures=failures, cost=cost, **self.stats())
