"""Honest CPU-scale scores and the scorer's cost per evaluation, for comparing two versions of the harness.

Scores one fixed nanochat checkpoint with the scorer alone (``--only same``: the bits per
byte must be equal between versions; the call's wall time is the scorer's cost, export
included), evaluates the nanochat seed (CPU scale, quick stages off) once per seed, and the speedrun
seed (speedrun_cpu: one evaluation trains it once per seed), through the real fitness of
whichever ``evolve`` the interpreter imports, and prints one JSON line per evaluation: the
score(s) and the seconds of the phases from the checkpoint's copy to the verdict (the
scorer's cost: ``checkpoint_copy``, ``export``, ``scoring_*``, ``verdict``). Run it with each
version's interpreter, in the same session, to compare them::

    python scripts/score_compare.py --seeds 0 1 2            # this checkout
    /path/to/other/.venv/bin/python scripts/score_compare.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

SCORER_PHASES = ("time_checkpoint_copy", "time_export", "time_scoring", "time_verdict")


def scorer_seconds(metrics: dict) -> float:
    """Seconds of the scorer's phases in an evaluation's metrics."""
    return sum(v for k, v in metrics.items() if k.startswith(SCORER_PHASES))


def nanochat(seed: int, scratch: Path) -> dict:
    from evolve.benchmarks.nanochat.fitness import NanochatFitness

    from evolve.harness.fitness import EvalContext, evaluate_safely

    fitness = NanochatFitness(scale="cpu", layered={"local_check": False, "short_run_steps": 0})
    work = (
        scratch / f"seed-{seed}"
    )  # the seed's files, copied: training writes its checkpoint there
    shutil.copytree(
        fitness.scale.seed_dir, work, ignore=shutil.ignore_patterns("checkpoint", "*.log")
    )
    ev = evaluate_safely(fitness, work, EvalContext(seed=seed, scratch=scratch))
    return {
        "status": ev.status.value,
        "val_bpb": ev.metrics.get("val_bpb"),
        "scorer_s": scorer_seconds(ev.metrics),
        "phases": {k: round(v, 2) for k, v in ev.metrics.items() if k.startswith(SCORER_PHASES)},
        "error": ev.artifacts.get("error", "")[:300],
    }


def same_checkpoint(repeats: int, scratch: Path) -> list[dict]:
    """nanochat's scorer on one fixed checkpoint (the seed's model at the CPU scale's sizes,
    weights drawn from seed 0 and perturbed), ``repeats`` times: the same bits per byte from
    either version of the harness, and the wall time of the scoring call (export included)."""
    import json as _json

    import torch
    from evolve.benchmarks.nanochat.fitness import NanochatFitness

    from evolve.harness.fitness import EvalContext
    from evolve.harness.lm import perturb_

    fitness = NanochatFitness(scale="cpu", layered={"local_check": False, "short_run_steps": 0})
    scale = fitness.scale
    config = dict(vocab_size=scale.vocab_size, seq_len=scale.seq_len, n_layer=4, n_head=4,
                  n_embd=128, mlp_ratio=4, init_std=0.02)  # fmt: skip
    source = (scale.seed_dir / "model.py").read_text()
    namespace: dict = {}
    exec(compile(source, "model.py", "exec"), namespace)  # the harness's own seed
    torch.manual_seed(0)
    model = namespace["build_model"](config)
    perturb_(model, torch.Generator().manual_seed(0), scale=0.05)
    results = []
    for repeat in range(repeats):
        folder = scratch / f"same-{repeat}"
        folder.mkdir()
        (folder / "model.py").write_text(source)
        (folder / "config.json").write_text(_json.dumps(config))
        torch.save(model.state_dict(), folder / "model.pt")
        ctx = EvalContext(seed=repeat, scratch=scratch)
        began = time.monotonic()
        if hasattr(fitness, "export_and_score"):  # this branch: export, then score
            verdict = fitness.export_and_score(folder, scratch / f"same-{repeat}-export", ctx)
        else:  # before: the scorer's model worker ran the candidate's model.py
            verdict = fitness.score(folder, ctx)
        results.append(
            {
                "status": verdict["status"],
                "val_bpb": verdict.get("val_bpb"),
                "call_s": round(time.monotonic() - began, 2),
            }  # fmt: skip
        )
    return results


def speedrun(seeds: list[int], scratch: Path, steps: int | None) -> dict:
    from evolve.benchmarks.speedrun import fitness as speedrun_fitness

    from evolve.harness.fitness import EvalContext, evaluate_safely

    settings = dict(
        preset="cpu",
        target=5.9,
        data_dir="stdlib",
        val_tokens=32768,
        vocab_size=512,
        eval_seq_len=64,
        eval_batch_size=16,
        n_seeds=len(seeds),
        alpha=0.01,
        reach=0.3,
        run_timeout_s=900,
        eval_timeout_s=300,
        overrides={"steps": steps, "warmup_steps": 2} if steps else None,
    )  # configs/benchmark/speedrun_cpu.yaml, with longer limits for a loaded machine
    fitness = speedrun_fitness.SpeedrunFitness(**settings)
    work = scratch / "speedrun-seed"  # a copy, as for nanochat
    shutil.copytree(Path(speedrun_fitness.__file__).parent / "seed", work)
    ev = evaluate_safely(fitness, work, EvalContext(seed=seeds[0], scratch=scratch))
    return {
        "status": ev.status.value,
        "losses": [ev.metrics.get(f"loss_{i}") for i in range(len(seeds))],
        "scorer_s": scorer_seconds(ev.metrics),
        "phases": {k: round(v, 2) for k, v in ev.metrics.items() if k.startswith(SCORER_PHASES)},
        "error": ev.artifacts.get("error", "")[:300],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--only", choices=("nanochat", "speedrun", "same"))
    parser.add_argument("--repeats", type=int, default=3, help="scorings of the fixed checkpoint")
    parser.add_argument(
        "--speedrun-steps", type=int, help="train speedrun's seed this many steps (default: 150)"
    )
    args = parser.parse_args()
    import evolve

    where = str(Path(evolve.__file__).resolve().parents[1])
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="score-compare-") as tmp:
        if args.only in (None, "same"):
            for out in same_checkpoint(args.repeats, Path(tmp)):
                print(json.dumps({"benchmark": "nanochat-same-checkpoint", "code": where,
                                  "load": os.getloadavg()[0], **out}), flush=True)  # fmt: skip
        if args.only in (None, "nanochat"):
            for seed in args.seeds:
                began = time.monotonic()
                out = nanochat(seed, Path(tmp))
                print(json.dumps({"benchmark": "nanochat", "code": where, "seed": seed, "load": load,
                                  "wall_s": round(time.monotonic() - began, 1), **out}), flush=True)  # fmt: skip
        if args.only in (None, "speedrun"):
            began = time.monotonic()
            out = speedrun(args.seeds, Path(tmp), args.speedrun_steps)
            print(json.dumps({"benchmark": "speedrun_cpu", "code": where, "seeds": args.seeds, "load": load, "steps": args.speedrun_steps,
                              "wall_s": round(time.monotonic() - began, 1), **out}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
