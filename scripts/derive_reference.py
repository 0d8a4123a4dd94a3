"""A seed's reference from its GPU runs over seeds and days: mean, spreads, speedrun's target, the gain a test can see.

Reads the JSON results that ``gpu_run`` and ``scripts/gpu_campaign.py`` write (any nesting:
a campaign part's JSON holds its commands' results), keeps the runs of one configuration
(nanochat: the seed at a ``--budget`` of 300 s, its val_bpb; speedrun: the one-GPU seed at
``--steps`` 820, its validation loss), and groups them by the number of training shards
(runs on other data are not the same reference), by the card they ran on (its name as torch
reports it: a reference on one card says nothing of another) and by day. For each group it prints:

- the mean, the seed-to-seed spread (the sd within a day, pooled), the day-to-day spread (the
  sd of the day means less what the seeds' spread explains) and the two combined;
- speedrun: the target a one-sided t-test of ``--n-seeds`` runs passes at p < ``--alpha``
  with probability >= ``--power`` when the seed's runs scatter with the combined spread; and,
  with no normal model, how often the fitness's own test passes when its seeds are drawn from
  the stored runs themselves (every draw, so one run far out weighs as it came), and the
  lowest target passing ``--power`` of those draws;
- the smallest gain a candidate needs for p < alpha to be reachable against the seed with
  ``--n-seeds`` runs each (a one-sided two-sample t-test at the spread measured): in the
  score for nanochat, in seconds of training for speedrun (whose fitness is the time).

    python scripts/derive_reference.py speedrun benchmarks/speedrun/results
    python scripts/derive_reference.py nanochat benchmarks/nanochat/results campaign-out/*.json
    python scripts/derive_reference.py nanochat benchmarks/nanochat/results --write benchmarks/references.json

``--write`` stores each card's reference (of the largest data group) in the references file
that ``gpu_run`` and the campaign judge their figures by (``benchmarks.gpu_script.judged``).
Runs that recorded no card and ran before 2026-12-05 are the H200's: every GPU run stored
until then was made on one (the lent machine was an H200 throughout).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from evolve.benchmarks.speedrun.fitness import decide
from scipy import optimize, stats

DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
H200_ONLY_UNTIL = "2026-12-05"  # every stored GPU run before this day ran on an H200
REFERENCE_KEYS = {"nanochat": "nanochat", "speedrun": "speedrun_1gpu"}  # benchmark -> its config


@dataclass(frozen=True)
class Run:
    """One seed's run: its score, time and day, and the data it trained on."""

    seed: int
    value: float  # nanochat: val_bpb; speedrun: validation loss
    time_s: float  # nanochat: steps; speedrun: training seconds (its fitness)
    day: str
    shards: int | None
    card: str


def _shards(sources: object) -> int | None:
    return len(sources) if isinstance(sources, list) and sources else None


def card_of(doc: dict, inherited: str | None) -> str | None:
    """The card a result document names (``device``, or a campaign's ``gpu``: "NAME, driver"),
    else the one of the document holding it."""
    named = doc.get("device") or doc.get("gpu")
    if isinstance(named, str) and named.startswith("NVIDIA"):
        return named.split(",")[0].strip()
    return inherited


def runs_in(
    doc: object, benchmark: str, day: str, setting: float, card: str | None = None
) -> Iterator[Run]:
    """The runs of ``benchmark`` at ``setting`` (budget s or steps) anywhere in ``doc``."""
    if isinstance(doc, list):
        for item in doc:
            yield from runs_in(item, benchmark, day, setting, card)
        return
    if not isinstance(doc, dict):
        return
    day = DATE.match(str(doc.get("date", ""))).group(0) if DATE.match(str(doc.get("date", ""))) else day  # fmt: skip
    card = card_of(doc, card)
    ran_on = card or ("NVIDIA H200" if day < H200_ONLY_UNTIL else "unrecorded card")
    if benchmark == "nanochat" and isinstance(doc.get("summary"), dict) and "val_bpb_mean" in doc["summary"]:  # fmt: skip
        summary = doc["summary"]
        if summary.get("budget_s") == setting and summary.get("device", "cpu") != "cpu":
            for run in doc.get("runs", []):
                if run.get("status") == "ok" and run.get("val_bpb") is not None:
                    steps = float(run.get("metrics", {}).get("steps", math.nan))
                    yield Run(int(run["seed"]), float(run["val_bpb"]), steps, day, summary.get("train_shards"), ran_on)  # fmt: skip
        return
    if benchmark == "speedrun" and isinstance(doc.get("seeds"), dict) and "args" in doc:
        cpu = str(doc["args"].get("cpu")) == "True"
        shards = _shards(doc.get("data", {}).get("summary", {}).get("train", {}).get("sources"))
        if doc["seeds"].get("steps") == setting and not cpu:
            for run in doc["seeds"].get("runs", []):
                if run.get("status") == "ok" and run.get("loss") is not None:
                    yield Run(int(run["seed"]), float(run["loss"]), float(run["train_s"]), day, shards, ran_on)  # fmt: skip
        return
    for value in doc.values():
        yield from runs_in(value, benchmark, day, setting, card)


def load(
    paths: list[Path], benchmark: str, setting: float, exclude: tuple[str, ...] = ()
) -> list[Run]:
    """Every run found in the JSON files under ``paths`` whose path contains none of ``exclude``,
    each once (merged files repeat runs)."""
    found: dict[tuple, Run] = {}
    files = [f for p in paths for f in (sorted(p.rglob("*.json")) if p.is_dir() else [p])]
    files = [f for f in files if not any(word in str(f) for word in exclude)]
    for path in files:
        folder_day = next((m.group(0) for part in path.parts if (m := DATE.match(part))), "unknown")
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for run in runs_in(doc, benchmark, folder_day, setting):
            found.setdefault((run.seed, round(run.value, 9), run.day, run.card), run)
    return sorted(found.values(), key=lambda r: (r.day, r.seed))


def per_day(runs: list[Run], field: str) -> dict[str, list[float]]:
    """The runs' ``field`` (``value`` or ``time_s``) grouped by day, for ``spreads``."""
    grouped = defaultdict(list)
    for run in runs:
        grouped[run.day].append(getattr(run, field))
    return dict(grouped)


def spreads(values_by_day: dict[str, list[float]]) -> dict[str, float]:
    """Mean; seed-to-seed sd (within days, pooled); day-to-day sd (between the day means, less
    the seeds' share: a one-way random-effects estimate, 0 when the days agree); the total."""
    values = [v for day in values_by_day.values() for v in day]
    within_df = sum(len(v) - 1 for v in values_by_day.values())
    within_ss = sum((x - statistics.fmean(v)) ** 2 for v in values_by_day.values() for x in v)
    seed_sd = math.sqrt(within_ss / within_df) if within_df else math.nan
    means = [statistics.fmean(v) for v in values_by_day.values()]
    day_sd = math.nan
    if len(means) > 1 and within_df:
        per_day = statistics.fmean(len(v) for v in values_by_day.values())
        day_sd = math.sqrt(max(statistics.variance(means) - seed_sd**2 / per_day, 0.0))
    elif len(means) > 1:  # one run a day: the days' spread holds both
        day_sd = statistics.stdev(means)
    parts = [s for s in (seed_sd, day_sd) if not math.isnan(s)]
    total = math.sqrt(sum(s * s for s in parts)) if parts else math.nan
    if len(values) > 1 and (math.isnan(total) or total == 0.0):
        total = statistics.stdev(values)
    return {"mean": statistics.fmean(values), "seed_sd": seed_sd, "day_sd": day_sd, "sd": total}


def pass_probability(margin_sds: float, n: int, alpha: float) -> float:
    """P(a one-sided t-test of ``n`` runs gives p < alpha) when the true mean is ``margin_sds``
    standard deviations below the target (noncentral t, df n - 1)."""
    critical = stats.t.ppf(1 - alpha, n - 1)
    return float(stats.nct.sf(critical, n - 1, margin_sds * math.sqrt(n)))


def target_for(mean: float, sd: float, n: int, alpha: float, power: float) -> float:
    """The lowest target, rounded up to 0.01, that the seed passes with probability >= ``power``."""
    margin = optimize.brentq(lambda m: pass_probability(m, n, alpha) - power, 0.0, 100.0)
    return math.ceil((mean + margin * sd) * 100 - 1e-9) / 100


def smallest_gain(sd: float, n: int, alpha: float, power: float) -> float:
    """The true gain (in ``sd``'s units) at which a one-sided two-sample t-test of ``n`` runs
    against ``n`` of the seed gives p < alpha with probability ``power`` (0.5: at a typical draw)."""
    df, critical = 2 * n - 2, stats.t.ppf(1 - alpha, 2 * n - 2)
    scale = sd * math.sqrt(2 / n)
    return optimize.brentq(lambda d: stats.nct.sf(critical, df, d / scale) - power, 0.0, 100 * scale + 1)  # fmt: skip


def draws(values: list[float], n: int) -> Iterator[tuple[tuple[float, ...], int]]:
    """Every draw of ``n`` runs from ``values`` with replacement, each ordered draw as likely
    (the runs' own distribution, its tails included: no normal model): each set of runs once,
    with the number of ordered draws it stands for (the test does not depend on the order)."""
    for picked in itertools.combinations_with_replacement(range(len(values)), n):
        orders = math.factorial(n) // math.prod(map(math.factorial, Counter(picked).values()))
        yield tuple(values[i] for i in picked), orders


def resampled_pass_rate(values: list[float], target: float, n: int, alpha: float) -> float:
    """The share of the ``n``-run draws from ``values`` that the fitness's own test
    (``speedrun.fitness.decide``: one-sided t-test, p < alpha) passes at ``target``."""
    passed = sum(orders for draw, orders in draws(values, n) if decide(list(draw), target, alpha)[0])  # fmt: skip
    return passed / len(values) ** n


def resampled_target(values: list[float], n: int, alpha: float, power: float) -> float | None:
    """The lowest target, in steps of 0.01 up to the largest run + 1, that passes at least
    ``power`` of the draws (``resampled_pass_rate``); None when none does."""
    target = math.ceil(statistics.fmean(values) * 100) / 100
    while target <= max(values) + 1.0:
        if resampled_pass_rate(values, target, n, alpha) >= power:
            return target
        target = round(target + 0.01, 2)
    return None


def groups(runs: list[Run]) -> dict[tuple[str, int | None], list[Run]]:
    """The runs by card and data (number of training shards), the most shards first."""
    grouped = defaultdict(list)
    for run in runs:
        grouped[run.card, run.shards].append(run)
    return dict(sorted(grouped.items(), key=lambda kv: (kv[0][0], -(kv[0][1] or 0))))


def references(runs: list[Run], setting: float) -> dict[str, dict]:
    """Each card's reference: the spreads of its largest data group, with what they rest on."""
    found: dict[str, dict] = {}
    for (card, shards), group in groups(runs).items():
        if card in found:
            continue  # a smaller data group of a card already stored
        by_day = per_day(group, "value")
        found[card] = {
            **{k: round(v, 4) for k, v in spreads(by_day).items() if not math.isnan(v)},
            "runs": len(group),
            "days": sorted(by_day),
            "train_shards": shards,
            "setting": setting,
        }
    return found


def write_references(path: Path, benchmark: str, found: dict[str, dict]) -> None:
    """Store ``found`` under ``benchmark`` in the references file, keeping the other entries."""
    stored = json.loads(path.read_text()) if path.is_file() else {}
    stored.setdefault(benchmark, {}).update(found)
    path.write_text(json.dumps(stored, indent=2, sort_keys=True) + "\n")


def report(runs: list[Run], benchmark: str, n: int, alpha: float, power: float) -> list[str]:
    """The reference of each data group, as lines."""
    lines = []
    for (card, shards), group in groups(runs).items():
        by_day, times = per_day(group, "value"), per_day(group, "time_s")
        s = spreads(by_day)
        name = "val_bpb" if benchmark == "nanochat" else "loss"
        lines.append(f"== {benchmark} on {card}, {shards or '?'} training shards: {len(group)} runs over {len(by_day)} days ==")  # fmt: skip
        for day in by_day:
            seeds = ", ".join(f"{r.seed}: {r.value:.4f}" for r in group if r.day == day)
            lines.append(f"  {day}: {seeds}")
        lines.append(f"  {name} mean {s['mean']:.4f}; sd run-to-run within a day (seeds and repeats) {s['seed_sd']:.4f}, day-to-day {s['day_sd']:.4f}, combined {s['sd']:.4f}")  # fmt: skip
        if len(group) < 2 or math.isnan(s["sd"]):
            lines.append("  (one run: no spread, no target)")
            continue
        if benchmark == "speedrun":
            target = target_for(s["mean"], s["sd"], n, alpha, power)
            lines.append(f"  target {target:.2f}: {n} seeds pass at p < {alpha} with probability "
                         f"{pass_probability((target - s['mean']) / s['sd'], n, alpha):.3f} (>= {power})")  # fmt: skip
            values = [run.value for run in group]
            found = resampled_target(values, n, alpha, power)
            lines.append(f"  resampled ({n} of the {len(values)} runs, all {len(values) ** n} draws, the fitness's test): "
                         f"target {target:.2f} passes {resampled_pass_rate(values, target, n, alpha):.3f}; "
                         + (f"the lowest target passing >= {power} is {found:.2f}" if found is not None
                            else f"no target up to the largest run + 1 passes >= {power}"))  # fmt: skip
            t = spreads(times)
            if not math.isnan(t["sd"]) and t["sd"] > 0:
                typical, sure = (smallest_gain(t["sd"], n, alpha, p) for p in (0.5, power))
                lines.append(f"  training time {t['mean']:.1f} s (sd {t['sd']:.2f}); to be faster than the seed at p < {alpha} "
                             f"with {n} seeds each a candidate needs {typical:.2f} s less at a typical draw, {sure:.2f} s for probability {power}")  # fmt: skip
        else:
            typical, sure = (smallest_gain(s["sd"], n, alpha, p) for p in (0.5, power))
            lines.append(f"  to beat the seed at p < {alpha} with {n} seeds each a candidate needs a val_bpb "
                         f"{typical:.4f} lower at a typical draw, {sure:.4f} for probability {power}")  # fmt: skip
    return lines or [f"no {benchmark} runs found"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("benchmark", choices=("nanochat", "speedrun"))
    parser.add_argument("paths", nargs="+", type=Path, help="JSON files or folders of them")
    parser.add_argument("--setting", type=float, help="nanochat's budget s (300) or speedrun's steps (820)")  # fmt: skip
    parser.add_argument("--n-seeds", type=int, default=3, help="seeds per evaluation (the config's n_seeds)")  # fmt: skip
    parser.add_argument("--exclude", action="append", default=[], help="leave out files whose path contains this (a broken run)")  # fmt: skip
    parser.add_argument("--alpha", type=float, default=0.01)
    parser.add_argument("--power", type=float, default=0.99)
    parser.add_argument("--write", type=Path, metavar="JSON", help="store each card's reference in this file (benchmarks/references.json)")  # fmt: skip
    args = parser.parse_args(argv)
    setting = args.setting or (300.0 if args.benchmark == "nanochat" else 820.0)
    runs = load(args.paths, args.benchmark, setting, tuple(args.exclude))
    print("\n".join(report(runs, args.benchmark, args.n_seeds, args.alpha, args.power)))
    if args.write and runs:
        found = references(runs, setting)
        command = " ".join(["python scripts/derive_reference.py", *(argv if argv is not None else sys.argv[1:])])  # fmt: skip
        for entry in found.values():
            entry["derived_by"] = command
        write_references(args.write, REFERENCE_KEYS[args.benchmark], found)
        print(f"references written to {args.write}")
    return 0 if runs else 1


if __name__ == "__main__":
    sys.exit(main())
