"""What the benchmarks' GPU measurement scripts share: their options, output folder and merged calls.

A measurement's seeds may run over several calls on machines of fewer GPUs (``--seeds``);
``--merge`` then combines the calls' result files into one measurement.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable
from pathlib import Path


def seed_list(text: str) -> list[int]:
    """``"0,1,2"`` -> [0, 1, 2]."""
    return [int(part) for part in text.split(",")]


def parser(
    description: str, *, gpus: str | None, seeds: str | None, smoke: str, results: str
) -> argparse.ArgumentParser:
    """A parser with the options every GPU script has: --gpus, --smoke, --seeds and --merge.

    Args:
        description: the script's docstring (shown raw).
        gpus: the default of --gpus (None: the script picks, e.g. every visible GPU).
        seeds: the default of --seeds (None: the script picks, e.g. one per GPU).
        smoke: what --smoke does.
        results: the name of the result file --merge reads.
    """
    made = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    made.add_argument("--gpus", default=gpus, help="comma-separated GPU ids to use")
    made.add_argument("--smoke", action="store_true", help=smoke)
    made.add_argument(
        "--seeds",
        type=seed_list,
        default=seed_list(seeds) if seeds else None,
        help="seeds to run, e.g. 0,1,2 or 2: one measurement's seeds may run in several calls",
    )
    made.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        metavar="JSON",
        help=f"no run: combine the {results} of several calls into one measurement",
    )
    return made


def out_folder(default: str) -> Path:
    """Where results go: $OUT (the device runner brings it back), else ``default``; created."""
    out = Path(os.environ.get("OUT") or default).resolve()
    out.mkdir(parents=True, exist_ok=True)
    return out


def merged_runs(groups: Iterable[list[dict]]) -> list[dict]:
    """The runs of several calls in seed order; a seed run twice is an error."""
    runs = sorted((run for group in groups for run in group), key=lambda run: run["seed"])
    if len({run["seed"] for run in runs}) != len(runs):
        raise SystemExit("--merge: a seed appears twice")
    return runs
