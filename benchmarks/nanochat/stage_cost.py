"""What the harness's extras cost next to a full evaluation: the quick stages, and the profile of timed steps.

Each stage runs the seed program once through the real harness (sandbox, probe, supervisor,
scorer), as a search's evaluation does, and its wall time is printed as one JSON line.
These numbers set the defaults of ``stages.SHORT_RUN_STEPS`` (see the README).

``--measure profile`` instead runs the full evaluation with and without the profile of timed
steps (``evolve.harness.profiling``), in alternating order per seed, and prints the
profile's cost as a share of the evaluation's wall time: starting and stopping the
profiler inside the timed window, how much longer the profiled steps and the as many steps
after them took than as many steps before (timed in the training process), and summarising
the events after the checkpoint was saved.

    python -m evolve.benchmarks.nanochat.stage_cost                      # CPU scale
    python -m evolve.benchmarks.nanochat.stage_cost --scale nanochat --dataset stdlib \\
        --steps 30 --skip-full                                      # one GPU
    python -m evolve.benchmarks.nanochat.stage_cost --measure profile --seeds 3
    python -m evolve.benchmarks.nanochat.stage_cost --measure references --seeds 3 --steps 20

``--measure references`` evaluates the seed as ``--seeds`` candidates, each by a fresh fitness
(as a fresh worker process would), with both quick stages on: first measuring the seed's
references in every one (the stored references removed before each: what every new worker
process paid before they were stored), then with the references measured once and stored.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from evolve.harness.fitness import EvalContext, evaluate_safely, write_files
from evolve.types import Evaluation

from . import stages
from .fitness import PROFILE_STEPS, NanochatFitness


def timed(what, *args) -> tuple[float, object]:
    start = time.monotonic()
    result = what(*args)
    return time.monotonic() - start, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", default="cpu", help="cpu | nanochat | auto")
    parser.add_argument("--dataset", help="prepared dataset (default: the scale's)")
    parser.add_argument(
        "--data-dir", help="where datasets live (default: $EVOLVE_DATA_DIR or ~/.cache)"
    )
    parser.add_argument("--eval-tokens", type=int, help="0 = all the validation split holds")
    parser.add_argument("--steps", type=int, default=20, help="steps of the short run")
    parser.add_argument("--seeds", type=int, default=2, help="evaluation seeds of each stage")
    parser.add_argument("--skip-full", action="store_true", help="time the quick stages only")
    parser.add_argument(
        "--measure",
        choices=("stages", "profile", "references"),
        default="stages",
        help="what to time: the quick stages, the profile of timed steps, or the seed's "
        "references measured each time then stored once",
    )
    args = parser.parse_args(argv)
    if args.measure == "references":
        return reference_cost(args)
    fitness = NanochatFitness(
        scale=args.scale,
        data_dir=args.data_dir,
        dataset=args.dataset,
        eval_tokens=args.eval_tokens,
        layered={"local_check": False, "short_run_steps": 0},
    )
    if args.measure == "profile":
        return profile_cost(fitness, args.seeds)
    seed_files = {p.name: p.read_text() for p in fitness.scale.seed_dir.glob("*.py")}
    root = Path(tempfile.mkdtemp(prefix="nanochat-stage-cost-"))
    try:
        for seed in range(args.seeds):
            work = root / f"seed{seed}"
            write_files(seed_files, work)
            ctx = EvalContext(
                seed=seed, scratch=root, gpu="0" if fitness.scale.device == "cuda" else None
            )
            local_s, values = timed(stages.LocalProbe(fitness), work, ctx)
            short_s, losses = timed(stages.ShortTraining(fitness), work, ctx, args.steps)
            row = {"scale": fitness.scale.name, "seed": seed, "local_check_s": round(local_s, 2),
                   f"short_run_{args.steps}_steps_s": round(short_s, 2)}  # fmt: skip
            for name, result in (("local_check", values), ("short_run", losses)):
                if isinstance(result, Evaluation):
                    row[f"{name}_error"] = result.artifacts.get("error")
            if isinstance(losses, list):
                row["short_run_last_loss"] = round(losses[-1], 4)
            if not args.skip_full:
                full_s, ev = timed(fitness.evaluate, work, ctx)
                row.update(
                    full_s=round(full_s, 2), val_bpb=ev.fitness, steps=ev.metrics.get("steps")
                )
            print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def reference_cost(args: argparse.Namespace) -> int:
    """Print each candidate's evaluation with the seed's references measured anew, then stored once."""
    settings = dict(scale=args.scale, data_dir=args.data_dir, dataset=args.dataset)
    settings |= dict(eval_tokens=args.eval_tokens, profile_steps=0)
    layered = {"local_check": True, "short_run_steps": args.steps}
    root = Path(tempfile.mkdtemp(prefix="nanochat-reference-cost-"))
    try:
        for mode in ("measured each time", "stored once"):
            for candidate in range(args.seeds):
                fitness = NanochatFitness(**settings, layered=layered)
                if mode == "measured each time" or candidate == 0:
                    shutil.rmtree(fitness.calibration_dir, ignore_errors=True)
                files = {p.name: p.read_text() for p in fitness.scale.seed_dir.glob("*.py")}
                work = root / f"{mode[0]}{candidate}"
                write_files(files, work)
                gpu = "0" if fitness.scale.device == "cuda" else None
                ev = evaluate_safely(
                    fitness, work, EvalContext(seed=candidate, scratch=root, gpu=gpu)
                )
                row = {"references": mode, "candidate": candidate, "wall_s": round(ev.wall_s, 2)}
                for phase in ("local_check", "short_run"):
                    row[f"{phase}_s"] = round(ev.metrics.get(f"time_{phase}", 0.0), 2)
                row["status"] = ev.status.value
                print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def profile_cost(fitness: NanochatFitness, seeds: int) -> int:
    """Print, per seed, the full evaluation without and with the profile, and the profile's cost."""
    files = {p.name: p.read_text() for p in fitness.scale.seed_dir.glob("*.py")}
    root = Path(tempfile.mkdtemp(prefix="nanochat-profile-cost-"))
    try:
        for seed in range(seeds):
            order = (0, PROFILE_STEPS) if seed % 2 == 0 else (PROFILE_STEPS, 0)
            for steps in order:
                fitness.profile_steps = steps
                work = root / f"seed{seed}-{steps}"
                write_files(files, work)
                ctx = EvalContext(
                    seed=seed, scratch=root, gpu="0" if fitness.scale.device == "cuda" else None
                )
                ev = evaluate_safely(fitness, work, ctx)
                m = ev.metrics
                row = {"seed": seed, "profile_steps": steps, "wall_s": round(ev.wall_s, 2)}
                row |= {k: m.get(k) for k in ("val_bpb", "steps", "training_s", "tokens_per_s")}
                if "reported_profile_window_s" in m:
                    # cost: starting and stopping in the timed window, the profiled steps' and the
                    # next steps' slowdown next to the steps before, summarising after the save
                    get = {k.removeprefix("reported_profile_"): v for k, v in m.items()}
                    before, profiled = get["step_s_before"], get["steps"]
                    slowdown = max(0.0, get["seconds"] - before * profiled)
                    lingering = max(0.0, get["step_s_after"] - before) * PROFILE_STEPS
                    cost = get["window_s"] + slowdown + lingering + get["report_s"]
                    row |= {
                        "window_s": round(get["window_s"], 3),
                        "profiled_vs_before": round(get["seconds"] / profiled / before, 3),
                        "after_vs_before": round(get["step_s_after"] / before, 3),
                        "report_s": round(get["report_s"], 3),
                        "cost_share": round(cost / ev.wall_s, 4),
                    }
                print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
