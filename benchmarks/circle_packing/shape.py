"""What a valid packing looks like: its tight constraints (fed back to the model) and its features.

A constraint is tight when its gap is below ``TIGHT``: a circle against a wall, or two
circles touching. Tight constraints are what holds a packing in place; a circle with fewer
than three is loose (it could move or grow). The features describe a packing's character
for the MAP-Elites grid; ``scripts/diversity.py`` measures how far each spreads
on real runs, which is how the grid's axes were chosen.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

TIGHT = 1e-6  # a gap below this counts as a contact
WALLS = ("left", "right", "bottom", "top")


@dataclass(frozen=True)
class Contacts:
    """The tight constraints of a packing: per wall the circles on it, and the touching pairs."""

    walls: dict[str, list[int]]
    pairs: list[tuple[int, int]]
    n: int

    def held_by(self) -> list[int]:
        """How many tight constraints hold each circle."""
        count = [0] * self.n
        for circles in self.walls.values():
            for i in circles:
                count[i] += 1
        for i, j in self.pairs:
            count[i] += 1
            count[j] += 1
        return count

    def loose(self) -> list[int]:
        """Circles held by fewer than three tight constraints (free to move or grow)."""
        return [i for i, held in enumerate(self.held_by()) if held < 3]

    def summary(self) -> str:
        """One paragraph for the model: which constraints are tight, which circles are loose."""
        on_wall = sorted({i for circles in self.walls.values() for i in circles})
        walls = "; ".join(
            f"{wall} {' '.join(map(str, circles))}"
            for wall, circles in self.walls.items()
            if circles
        )
        pairs = " ".join(f"{i}-{j}" for i, j in self.pairs)
        loose = self.loose()
        return (
            f"Tight constraints (gap < {TIGHT:g}), circles numbered as in packing.json: "
            f"{len(on_wall)} of {self.n} circles touch a wall ({walls or 'none'}); "
            f"{len(self.pairs)} touching pairs ({pairs or 'none'}); "
            f"{len(loose)} loose circles held by fewer than 3 ({' '.join(map(str, loose)) or 'none'})."
        )


def contacts(centers: list, radii: list) -> Contacts:
    """The tight constraints of a valid packing."""
    walls: dict[str, list[int]] = {wall: [] for wall in WALLS}
    for i, ((x, y), r) in enumerate(zip(centers, radii, strict=True)):
        for wall, gap in zip(WALLS, (x - r, 1 - x - r, y - r, 1 - y - r), strict=True):
            if gap < TIGHT:
                walls[wall].append(i)
    pairs = [
        (i, j)
        for (i, (a, ra)), (j, (b, rb)) in itertools.combinations(
            enumerate(zip(centers, radii, strict=True)), 2
        )
        if math.dist(a, b) - ra - rb < TIGHT
    ]
    return Contacts(walls=walls, pairs=pairs, n=len(radii))


def features(centers: list, radii: list, found: Contacts, code_chars: int) -> dict[str, float]:
    """Every candidate descriptor of a valid packing (the grid uses some of them)."""
    n = len(radii)
    mean = math.fsum(radii) / n
    total = math.fsum(radii)
    cx = math.fsum(x * r for (x, _), r in zip(centers, radii, strict=True)) / total
    cy = math.fsum(y * r for (_, y), r in zip(centers, radii, strict=True)) / total
    return {
        "radius_std": math.sqrt(math.fsum((r - mean) ** 2 for r in radii) / n),
        "radius_range": max(radii) - min(radii),
        "wall_fraction": len({i for circles in found.walls.values() for i in circles}) / n,
        "contacts_per_circle": len(found.pairs) / n,
        "loose_fraction": len(found.loose()) / n,
        "offset": math.hypot(cx - 0.5, cy - 0.5),  # radius-weighted centre off the square's centre
        "code_chars": float(code_chars),  # the program's size: spreads where shapes converge
    }
