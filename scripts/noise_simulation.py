"""Simulate noise-aware selection: how often no-op challengers are promoted, how often real gains are.

A noisy fitness returns ``true value + N(0, sigma^2)`` per evaluation seed. Each simulated run
calibrates on the seed program (``noise.seeds`` draws), then offers challengers to the seed's
cell through the same functions the search uses (``evolve.archive.noise.pvalue`` and ``next_count``):
- no-op challengers (identical code, new seeds: the same true value) -> fraction wrongly
  promoted (the goal is under 1%);
- real improvements of ``--gain`` sigmas -> fraction accepted (power);
- both against a non-seed incumbent that entered an empty cell with `new_cell_seeds`
  evaluations (default one), the common case deeper in a run.
It also reports evaluations spent per challenger, and plain comparison for reference.

    python scripts/noise_simulation.py                 # the default settings and a few variants
    python scripts/noise_simulation.py --runs 200 --json out.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, dataclass

from evolve.archive.noise import make_calibration, next_count, pvalue
from evolve.archive.statistics import Samples
from evolve.settings import NoiseSettings
from evolve.types import EvalStatus, Evaluation, Objective

OBJECTIVE = Objective(name="fitness")


@dataclass
class Row:
    """One configuration's outcome."""

    settings: str
    incumbent: str
    noop_promoted: float
    noop_evals: float
    gain_accepted: float
    gain_evals: float
    challengers: int


def challenge(
    rng: random.Random,
    true_gain: float,
    incumbent: Samples,
    incumbent_is_seed: bool,
    calibration,
    settings: NoiseSettings,
) -> tuple[bool, int]:
    """Offer one challenger whose true value is ``true_gain`` above the incumbent's; (promoted, evals)."""
    values = [rng.gauss(true_gain, 1.0)]
    while True:
        p = pvalue(
            Samples.of(values),
            incumbent,
            calibration=calibration,
            incumbent_is_seed=incumbent_is_seed,
            objective=OBJECTIVE,
        )
        target = next_count(len(values), p, settings)
        if target is None:
            return p < settings.look_alpha(len(values)), len(values)
        values += [rng.gauss(true_gain, 1.0) for _ in range(target - len(values))]


def simulate(
    settings: NoiseSettings, *, runs: int, per_run: int, gain: float, seed: int, incumbent: str
) -> Row:
    """Fractions promoted over ``runs`` calibrations x ``per_run`` challengers of each kind."""
    rng = random.Random(seed)
    noop = noop_evals = hits = hit_evals = 0
    for _ in range(runs):
        draws = [rng.gauss(0.0, 1.0) for _ in range(settings.seeds)]
        calibration = make_calibration(
            "seed",
            [Evaluation(status=EvalStatus.OK, fitness=v, seeds=(i,)) for i, v in enumerate(draws)],
        )
        if incumbent == "seed":
            inc, is_seed = calibration.fitness, True
        else:  # an elite that entered an empty cell with new_cell_seeds evaluations; true value 0
            draws = [rng.gauss(0.0, 1.0) for _ in range(settings.new_cell_seeds)]
            inc, is_seed = Samples.of(draws), False
        for _ in range(per_run):
            promoted, evals = challenge(rng, 0.0, inc, is_seed, calibration, settings)
            noop += promoted
            noop_evals += evals
            promoted, evals = challenge(rng, gain, inc, is_seed, calibration, settings)
            hits += promoted
            hit_evals += evals
    total = runs * per_run
    label = (
        f"seeds={settings.seeds} alpha={settings.alpha} close={settings.close} "
        f"schedule={list(settings.schedule)}"
        + (f" new_cell={settings.new_cell_seeds}" if settings.new_cell_seeds > 1 else "")
    )
    return Row(
        settings=label,
        incumbent=incumbent,
        noop_promoted=noop / total,
        noop_evals=noop_evals / total,
        gain_accepted=hits / total,
        gain_evals=hit_evals / total,
        challengers=total,
    )


def plain(*, runs: int, per_run: int, gain: float, seed: int) -> Row:
    """Plain comparison (noise ignored, one evaluation each) against a seed measured once."""
    rng = random.Random(seed)
    total = runs * per_run
    noop = sum(rng.gauss(0, 1) > rng.gauss(0, 1) for _ in range(total))
    hits = sum(rng.gauss(gain, 1) > rng.gauss(0, 1) for _ in range(total))
    return Row(
        "plain comparison (noise.seeds=1)", "seed", noop / total, 1.0, hits / total, 1.0, total
    )


VARIANTS = (
    NoiseSettings(seeds=5),  # the defaults
    NoiseSettings(seeds=5, alpha=0.01),
    NoiseSettings(seeds=5, close=0.5),
    NoiseSettings(seeds=5, schedule=(1, 8)),
    NoiseSettings(seeds=5, schedule=(1, 4, 10)),
    NoiseSettings(seeds=3),
    NoiseSettings(seeds=10),
    NoiseSettings(seeds=10, schedule=(1, 8)),
    NoiseSettings(seeds=5, new_cell_seeds=4),
    NoiseSettings(seeds=10, schedule=(1, 8), new_cell_seeds=4),
)


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=1000, help="calibrations simulated per setting")
    parser.add_argument(
        "--per-run", type=int, default=40, help="challengers of each kind per calibration"
    )
    parser.add_argument("--gain", type=float, default=2.0, help="true improvement, in sigmas")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--only-default", action="store_true", help="simulate the default settings only"
    )
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args(argv)
    variants = VARIANTS[:1] if args.only_default else VARIANTS
    start = time.monotonic()
    rows = [plain(runs=args.runs, per_run=args.per_run, gain=args.gain, seed=args.seed)]
    for settings in variants:
        for incumbent in ("seed", "single"):
            rows.append(
                simulate(
                    settings,
                    runs=args.runs,
                    per_run=args.per_run,
                    gain=args.gain,
                    seed=args.seed,
                    incumbent=incumbent,
                )
            )
    print(
        f"{'settings':<66} {'incumbent':<9} {'no-op promoted':>14} {'evals':>6} "
        f"{f'+{args.gain:g}sd accepted':>14} {'evals':>6}"
    )
    for r in rows:
        print(
            f"{r.settings:<66} {r.incumbent:<9} {r.noop_promoted:>14.2%} {r.noop_evals:>6.2f} "
            f"{r.gain_accepted:>14.2%} {r.gain_evals:>6.2f}"
        )
    print(
        f"({rows[-1].challengers} challengers of each kind per row; {time.monotonic() - start:.0f}s)"
    )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "rows": [asdict(r) for r in rows]}, handle, indent=2)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
