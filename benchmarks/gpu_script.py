"""What the benchmarks' GPU measurement scripts share: options, output folder, merged calls, references.

A measurement's seeds may run over several calls on machines of fewer GPUs (``--seeds``);
``--merge`` then combines the calls' result files into one measurement. A figure is judged
only against the reference of the card it was measured on (``references.json`` beside this
file, written by ``scripts/derive_reference.py --write``).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterable
from pathlib import Path

REFERENCES = Path(__file__).with_name("references.json")


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


def card_name() -> str:
    """The card this process's first visible GPU is, as torch names it ("cpu" without one)."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def judged(
    benchmark: str, card: str, value: float, setting: float, *, path: Path = REFERENCES
) -> str:
    """One line that sets ``value`` against ``benchmark``'s reference on ``card``, or says that
    there is none for that card (a reference measured on another card says nothing of this one)
    or none at this ``setting`` (the budget in s or the steps the run had).

    ``benchmark`` is a key of the references file: ``nanochat`` (val_bpb at a budget) or
    ``speedrun_1gpu`` (validation loss at a step count).
    """
    stored = json.loads(path.read_text()).get(benchmark, {}) if path.is_file() else {}
    reference = stored.get(card)
    if reference is None:
        others = ", ".join(sorted(stored)) or "none"
        return (
            f"no {benchmark} reference for {card} (references exist for: {others}); "
            "this figure cannot be judged against a reference yet"
        )
    if reference["setting"] != setting:
        return (
            f"the {benchmark} reference for {card} was measured at {reference['setting']:g}, "
            f"this run at {setting:g}: not comparable"
        )
    sd = reference.get("sd")
    distance = f", {(value - reference['mean']) / sd:+.1f} sd" if sd else ""
    return (
        f"{value:.4f} against the {card} reference {reference['mean']:.4f} "
        f"(sd {sd if sd is not None else 'unknown'}, {reference['runs']} runs over "
        f"{len(reference['days'])} days){distance}"
    )
