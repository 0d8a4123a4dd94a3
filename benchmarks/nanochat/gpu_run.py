"""GPU measurements of the nanochat benchmark: the seed at the full budget over several seeds, in parallel.

Prepares the Wikipedia dataset (tokenizer with 8192 tokens, trained on all cores), measures
the GPU's bf16 matmul rate (the peak assumed for MFU), then runs one harness evaluation of
the seed per GPU at the same time (seed i on GPU i) and reports val_bpb (mean, std),
tokens/s, MFU, peak memory and the harness overhead (wall time minus budget). Writes
``results.json``, ``RESULTS-gpu.md`` (markdown for RESULTS.md) and the logs into ``$OUT``.
``--program DIR`` measures another training program (train.py, model.py) instead of the
seed; ``--bare`` then runs it again without the harness (``evolve.harness.bare``: no
sandbox, its training rows in memory) on the same GPU: the harness's tax on its timed
tokens/s; ``--bare-sandboxed`` runs it bare inside the harness's sandbox too (the sandbox's
share of that tax).

    python -m evolve.benchmarks.nanochat.gpu_run --gpus 0,1,2            # 300 s budget, ~9 min
    python -m evolve.benchmarks.nanochat.gpu_run --gpus 0,1,2 --smoke    # every step, tiny budget, ~2-3 min
    python -m evolve.benchmarks.nanochat.gpu_run --prepare-only          # only the data (~1-2 min)
    python -m evolve.benchmarks.nanochat.gpu_run --device cpu --tiny     # CPU check of this script
    python -m evolve.benchmarks.nanochat.gpu_run --gpus 0 --seeds 2      # a third seed, another call
    python -m evolve.benchmarks.nanochat.gpu_run --gpus 0 --budget 60 --bare --program DIR
    python -m evolve.benchmarks.nanochat.gpu_run --gpus 0 --budget 60 --bare --bare-sandboxed
    python -m evolve.benchmarks.nanochat.gpu_run --merge a/results.json b/results.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from evolve.harness import gpus as placement
from evolve.harness.bare import run_bare
from evolve.harness.fitness import EvalContext, evaluate_safely

from .. import gpu_clocks, gpu_script
from . import prepare, scales
from .client import CONFIG_ENV
from .fitness import NanochatFitness
from .supervisor import Rows

CHUNK_CHARS = (
    6000  # ~1500 tokens: Wikipedia articles are cut at paragraph ends so rows use whole articles
)


def matmul_peak(device: str, size: int = 8192, iters: int = 20) -> float:
    """Measured dense matmul rate in FLOP/s (bf16 on CUDA, float32 on CPU)."""
    import torch

    if device == "cpu":
        size, iters, dtype = 1024, 5, torch.float32
    else:
        dtype = torch.bfloat16
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    if device != "cpu":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        a @ b
    if device != "cpu":
        torch.cuda.synchronize()
    rate = 2 * size**3 * iters / (time.perf_counter() - start)
    del a, b
    if device != "cpu":
        torch.cuda.empty_cache()
    return rate


def flops_per_token(config: dict) -> float:
    """Training FLOPs per token: 6 x matmul parameters + causal attention (6 * layers * width * seq)."""
    d, layers = config["n_embd"], config["n_layer"]
    matmul_params = (
        layers * (4 * d * d + 2 * config.get("mlp_ratio", 4) * d * d) + d * config["vocab_size"]
    )
    return 6.0 * matmul_params + 6.0 * layers * d * config["seq_len"]


def prepare_wiki(wiki: Path, data_dir: Path, name: str, vocab: int, max_chars: int | None) -> Path:
    root = data_dir / name
    if prepare.is_prepared(root):
        return root
    train = sorted(wiki.glob("train-*.jsonl.xz"))
    if not train or not (wiki / "val.jsonl.xz").is_file():
        raise SystemExit(
            f"{wiki} needs train-NN.jsonl.xz shards and val.jsonl.xz; carry data/wikipedia/ here"
        )
    argv = [
        "--name",
        name,
        "--data-dir",
        str(data_dir),
        "--vocab",
        str(vocab),
        "--chunk-chars",
        str(CHUNK_CHARS),
    ]
    argv += ["--train", *map(str, train), "--val", str(wiki / "val.jsonl.xz")]
    if max_chars:
        argv += ["--max-train-chars", str(max_chars), "--tokenizer-chars", str(max_chars)]
    prepare.main(argv)
    return root


def run_one(fitness: NanochatFitness, seed: int, root: Path, options: dict, gpu: str | None) -> dict:
    """One harness evaluation of the program (``options["program"]``, default the seed); with
    ``options["rescore"]`` its checkpoint scored again (see rescored), with ``options["bare"]``
    the program run again bare, with ``options["bare_sandboxed"]`` bare in the sandbox (see
    bare_tax)."""
    program = options.get("program") or fitness.benchmark_overrides["seed"]
    work = root / f"seed{seed}"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(program, work, ignore=shutil.ignore_patterns("__pycache__", "checkpoint", "initial"))
    scratch = root / f"scratch{seed}"
    scratch.mkdir(parents=True, exist_ok=True)
    ctx = EvalContext(
        seed=seed,
        gpu=gpu,
        hardware=f"gpu {gpu}" if gpu else "cpu",
        scratch=scratch,
        timeout_s=fitness.benchmark_overrides["timeout_s"],
    )
    start = time.monotonic()
    with gpu_clocks.sampled(gpu) as clocks:
        ev = evaluate_safely(fitness, work, ctx)
    wall = time.monotonic() - start
    config_path = work / "checkpoint" / "config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    checkpoint = scratch / "rescore"  # the harness's copy (the training program's is its own)
    rescore = options.get("rescore") and ev.fitness is not None
    if rescore:
        shutil.copytree(work / "checkpoint", checkpoint)
    return {
        "seed": seed,
        "gpu": gpu,
        "status": str(ev.status),
        "val_bpb": ev.fitness,
        "wall_s": wall,
        "metrics": dict(ev.metrics),
        "clocks": clocks.summary(),
        "config": config,
        "artifacts": dict(ev.artifacts),
        "rescored": rescored(fitness, checkpoint, ctx) if rescore else [],
        "bare": bare_tax(fitness, Path(program), root / f"bare{seed}", ctx, ev.metrics)
        if options.get("bare") and ev.ok
        else None,
        "bare_sandboxed": bare_tax(fitness, Path(program), root / f"sandboxed{seed}", ctx, ev.metrics,
                                   sandboxed=True)
        if options.get("bare_sandboxed") and ev.ok
        else None,
    }


def bare_tax(fitness: NanochatFitness, program: Path, folder: Path, ctx: EvalContext, metrics: dict,
             *, sandboxed: bool = False) -> dict:  # fmt: skip
    """The program run bare (``evolve.harness.bare``) on the same device, with the environment the
    harness gives it and the training rows the harness's feed makes for this seed, packed into
    memory beforehand (a quarter more than the harness run used; reused from the start after).
    ``sandboxed``: inside the training harness's sandbox (the sandbox's share of the tax)."""
    shutil.copytree(program, folder, ignore=shutil.ignore_patterns("__pycache__", "checkpoint", "initial"))
    settings = fitness.program_settings(folder, ctx)
    scale = fitness.scale
    rows = Rows(settings)(int(metrics["tokens"] * 1.25 / scale.seq_len) + 64, True)
    env = {**fitness.program_env(ctx), CONFIG_ENV: json.dumps(settings)}
    with gpu_clocks.sampled(ctx.gpu) as clocks:
        result = run_bare(folder, rows, entry="train.py", env=env,
                          budget_s=scale.budget_s, untimed_steps=scale.untimed_steps,
                          vocab=scale.vocab_size, bos=settings["bos_id"], timeout_s=scale.train_limit_s,
                          sandbox=fitness.training_sandbox() if sandboxed else None)  # fmt: skip
    return {**result, "clocks": clocks.summary()}


def rescored(fitness: NanochatFitness, checkpoint: Path, ctx: EvalContext) -> list[dict]:
    """The scored checkpoint scored again by the harness's scorer, as usual and in strict mode
    (the auditor's re-evaluation: more causality probes): what strict mode adds to scoring."""
    rows = []
    for strict in (False, True):
        start = time.monotonic()
        verdict = fitness.score(checkpoint, dataclasses.replace(ctx, strict=strict))
        seconds = time.monotonic() - start
        ok = isinstance(verdict, dict) and verdict.get("status") == "ok"
        rows.append(
            {
                "strict": strict,
                "seconds": seconds,
                "status": verdict.get("status")
                if isinstance(verdict, dict)
                else str(verdict.status),
                "val_bpb": float(verdict["val_bpb"]) if ok else None,
                "probe_batches": verdict.get("probe_batches") if ok else None,
            }
        )
    return rows


def summarize(runs: list[dict], peak: float, scale: scales.Scale, device_name: str) -> dict:
    ok = [r for r in runs if r["val_bpb"] is not None]
    for run in ok:
        m = run["metrics"]
        run.setdefault("peak_flops", peak)  # runs merged from several calls keep their own
        run["overhead_s"] = run["wall_s"] - scale.budget_s
        run["overhead_per_eval_s"] = run["overhead_s"] - once_per_run_s(run)
        run["mfu"] = (
            m["tokens_per_s"] * flops_per_token(run["config"]) / run["peak_flops"]
            if run["config"]
            else float("nan")
        )
    values = [r["val_bpb"] for r in ok]

    def stat(key, source=None):
        xs = [(r["metrics"] if source == "m" else r).get(key) for r in ok]
        xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
        return statistics.fmean(xs) if xs else float("nan")

    return {
        "device": device_name,
        "scale": scale.name,
        "budget_s": scale.budget_s,
        "peak_flops": peak,
        "runs_ok": len(ok),
        "runs": len(runs),
        "val_bpb_mean": statistics.fmean(values) if values else float("nan"),
        "val_bpb_std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "tokens_per_s": stat("tokens_per_s", "m"),
        "mfu": stat("mfu"),
        "overhead_s": stat("overhead_s"),
        "overhead_per_eval_s": stat("overhead_per_eval_s"),
        "peak_mem_gb": stat("reported_peak_mem_gb", "m"),
        "steps": stat("steps", "m"),
        "startup_s": stat("startup_s", "m"),
        "eval_s": stat("eval_s", "m"),
        "params": stat("params", "m"),
    }


def markdown(
    summary: dict, runs: list[dict], args: argparse.Namespace, eval_tokens: int, dataset: str
) -> str:
    s = summary
    lines = [
        f"### Seed at the {s['budget_s']:g} s budget ({s['device']}, {s['runs']} seeds, "
        + (
            f"one per GPU, over {len(s['merged_from'])} calls)"
            if "merged_from" in s
            else "in parallel)"
        ),
        "",
        f"Command: `python -m evolve.benchmarks.nanochat.gpu_run {' '.join(args.argv)}`; dataset `{dataset}` "
        f"(Wikipedia 2015, {summary.get('train_shards', '?')} train shards, articles cut at {CHUNK_CHARS} chars, vocab "
        f"{summary.get('vocab_size', '?')}), {eval_tokens:,} validation targets, "
        f"rows of {summary.get('seq_len', '')} tokens.",
        f"Peak assumed for MFU: measured dense matmul rate {s['peak_flops'] / 1e12:.3g} TFLOP/s "
        f"({'bf16 8192^3' if s['device'] != 'cpu' else 'fp32 1024^3'}).",
        "",
        "| seed | GPU | status | val_bpb | steps | tokens/s | MFU | peak mem (GB) | startup s | eval s | wall - budget s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        m = r["metrics"]
        bpb = f"{r['val_bpb']:.4f}" if r["val_bpb"] is not None else "-"
        lines.append(
            f"| {r['seed']} | {r['gpu'] or 'cpu'} | {r['status']} | {bpb} | {m.get('steps', '-')} | "
            f"{m.get('tokens_per_s', float('nan')):,.0f} | {r.get('mfu', float('nan')):.1%} | "
            f"{m.get('reported_peak_mem_gb', float('nan')):.1f} | {m.get('startup_s', float('nan')):.1f} | "
            f"{m.get('eval_s', float('nan')):.1f} | {r.get('overhead_s', float('nan')):.1f} |"
        )
    lines += [
        "",
        f"**val_bpb {s['val_bpb_mean']:.4f} ± {s['val_bpb_std']:.4f}** (mean ± std over {s['runs_ok']} seeds); "
        f"{s['tokens_per_s']:,.0f} tokens/s; MFU {s['mfu']:.1%}; peak memory {s['peak_mem_gb']:.1f} GB; "
        f"harness overhead (wall − budget) {s['overhead_s']:.0f} s, of which start-up incl. compile "
        f"{s['startup_s']:.0f} s and scoring {s['eval_s']:.0f} s; {s['params']:,.0f} parameters.",
        "",
    ]
    if s["device"] != "cpu" and s["runs_ok"]:
        judged = gpu_script.judged("nanochat", s["device"], s["val_bpb_mean"], s["budget_s"])
        lines += [f"Reference: {judged}.", ""]
    for r in runs:
        lines += [
            f"Seed {r['seed']}: {phase_line(r)}",
            "",
            f"Seed {r['seed']}: {overhead_line(r, s['budget_s'])}",
            "",
            f"Seed {r['seed']}, GPU while busy: {gpu_clocks.describe(r.get('clocks') or {})}.",
            "",
            *bare_line(r),
        ] + [
            f"Seed {r['seed']}, its checkpoint scored again{' in strict mode' if row['strict'] else ''}: "
            f"{row['status']}, val_bpb {row['val_bpb'] or float('nan'):.4f}, {row['probe_batches']} probe batches, "
            f"{row['seconds']:.1f} s ({row['seconds'] / r['wall_s']:.2%} of the evaluation's wall time)."
            for row in r.get("rescored", [])
        ]
        if len(r.get("rescored", [])) == 2:
            extra = r["rescored"][1]["seconds"] - r["rescored"][0]["seconds"]
            lines += [
                f"Strict mode adds {extra:.1f} s to scoring: {extra / r['wall_s']:.2%} of the "
                f"evaluation's {r['wall_s']:.0f} s.",
                "",
            ]
    return "\n".join(lines)


def bare_line(run: dict) -> list[str]:
    """The run's timed tokens/s bare, bare in the sandbox and under the harness (``--bare``,
    ``--bare-sandboxed``), whichever were run, or nothing."""
    m = run["metrics"]
    lines = []
    for key, what in (("bare", "run bare"), ("bare_sandboxed", "run bare inside the harness's sandbox")):
        bare = run.get(key)
        if bare and bare["tokens_per_s"] > 0:
            lines += [
                f"Seed {run['seed']}, timed tokens/s: {what} {bare['tokens_per_s']:,.0f} ({bare['steps']} "
                f"steps), under the harness {m['tokens_per_s']:,.0f} ({m['steps']} steps): the harness "
                f"keeps {m['tokens_per_s'] / bare['tokens_per_s']:.2%} of that speed; GPU while busy: "
                f"{gpu_clocks.describe(bare.get('clocks') or {})}.",
                "",
            ]
    return lines


ONCE_PER_RUN = ("cache_warmup",)
"""Phases a run pays once, not per evaluation: the compile cache's warm-up with the seed."""


def once_per_run_s(run: dict) -> float:
    """The run's seconds in ``ONCE_PER_RUN`` phases."""
    return sum(run["metrics"].get(f"time_{name}", 0.0) for name in ONCE_PER_RUN)


def overhead_line(run: dict, budget_s: float) -> str:
    """The harness's overhead per evaluation (wall − budget − the once-per-run phases), as a share
    of the budget, with its phases (all but training and those), largest first."""
    once, per_eval = once_per_run_s(run), run["wall_s"] - budget_s - once_per_run_s(run)
    phases = {k[5:]: v for k, v in run["metrics"].items() if k.startswith("time_")}
    parts = [
        f"{name} {seconds:.1f}"
        for name, seconds in sorted(phases.items(), key=lambda kv: -kv[1])
        if name not in ("training", *ONCE_PER_RUN) and seconds >= 0.05
    ]
    return (
        f"overhead per evaluation {per_eval:.1f} s = {per_eval / budget_s:.1%} of budget: "
        + ", ".join(parts)
        + f" s; once per run, apart: {' + '.join(ONCE_PER_RUN)} {once:.1f} s"
    )


def phase_line(run: dict) -> str:
    """Where the evaluation's wall time went: its time_<phase> metrics, largest first."""
    phases = {k[5:]: v for k, v in run["metrics"].items() if k.startswith("time_")}
    total = sum(phases.values())
    parts = [
        f"{name} {seconds:.1f} s ({seconds / run['wall_s']:.1%})"
        for name, seconds in sorted(phases.items(), key=lambda kv: -kv[1])
        if seconds >= 0.05
    ]
    return f"time by phase (sum {total:.1f} s of wall {run['wall_s']:.1f} s): " + "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = gpu_script.parser(
        __doc__,
        gpus="0,1,2",
        seeds=None,
        smoke="tiny budget and data: checks every step (compile included) in ~2-3 min",
        results="results.json",
    )
    parser.add_argument(
        "--budget", type=float, help="training budget in seconds (default: the scale's)"
    )
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--prepare-only", action="store_true", help="prepare the dataset and stop")
    parser.add_argument(
        "--tiny", action="store_true", help="CPU scale, a few seconds (to test this script)"
    )
    parser.add_argument(
        "--wiki", type=Path, default=Path("data/wikipedia"), help="folder with the jsonl.xz shards"
    )
    parser.add_argument(
        "--data-dir", type=Path, default=Path("data/nanochat"), help="prepared datasets go here"
    )
    parser.add_argument(
        "--program",
        type=Path,
        help="a training program's folder (train.py, model.py) to measure instead of the seed",
    )
    parser.add_argument(
        "--bare",
        action="store_true",
        help="after each evaluation, run the same program bare (no sandbox, no harness process, "
        "its training rows in memory) on the same GPU and compare the timed tokens/s",
    )
    parser.add_argument(
        "--bare-sandboxed",
        action="store_true",
        help="after each evaluation, run the same program bare but inside the training harness's "
        "sandbox: with --bare, splits the harness's cost into the sandbox's and the rest's",
    )
    parser.add_argument(
        "--profile-steps",
        type=int,
        help="steps the harness profiles for feedback (default the fitness's; 0: none)",
    )
    parser.add_argument(
        "--local-check",
        action="store_true",
        help="run the local check before the full run, as a search does (its time is a phase; "
        "on a GPU the training program is launched while it runs)",
    )
    parser.add_argument(
        "--strict-cost",
        action="store_true",
        help="after each evaluation, score its checkpoint again as usual and in strict mode: "
        "what the auditor's strict re-evaluation adds, as a share of the evaluation's wall time",
    )
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    out = gpu_script.out_folder("nanochat-gpu-out")
    device = (
        ("cuda" if scales.cuda_available() else "cpu") if args.device == "auto" else args.device
    )
    tiny = args.tiny or device == "cpu"
    if args.merge:
        return merge(args, out)
    gpus: list[str | None] = [None, None]  # two CPU runs; --prepare-only needs no GPU at all
    if device == "cuda" and not args.prepare_only:
        gpus = list(placement.chosen(args.gpus))
    seeds = args.seeds or list(range(len(gpus)))
    if len(seeds) != len(gpus) and not args.prepare_only:
        parser.error(f"--seeds names {len(seeds)} seeds for {len(gpus)} GPUs: one seed per GPU")
    t0 = time.monotonic()
    data_dir = args.data_dir.resolve()
    if tiny:
        name, vocab, max_chars = "wikipedia-tiny", 2048, 3_000_000
    elif args.smoke:
        name, vocab, max_chars = "wikipedia-smoke", 8192, 20_000_000
    else:
        name, vocab, max_chars = "wikipedia", 8192, None
    prepare_wiki(args.wiki.resolve(), data_dir, name, vocab, max_chars)
    prep_s = time.monotonic() - t0
    if args.prepare_only:
        print(
            f"nanochat gpu_run: dataset {name} ready under {data_dir} in {prep_s:.0f}s", flush=True
        )
        return 0
    base = scales.resolve("cpu" if tiny else "nanochat", dataset=name, vocab_size=vocab)
    budget = args.budget or (3.0 if tiny else 15.0 if args.smoke else base.budget_s)
    # smoke/tiny: two batches; full run: every whole batch the validation split holds
    eval_tokens = base.seq_len * base.eval_batch_rows * 2 if tiny or args.smoke else 0
    fitness = NanochatFitness(
        scale=base.name,
        data_dir=str(data_dir),
        dataset=name,
        vocab_size=vocab,
        budget_s=budget,
        eval_tokens=eval_tokens,
        compile_cache=None if tiny else str(data_dir.parent / "nanochat-compile-cache"),
        # the full run alone, so that wall - budget stays the full run's overhead; with
        # --local-check, the check first (on a GPU the training program starts during it)
        layered={"local_check": args.local_check, "short_run_steps": 0},
        **({} if args.profile_steps is None else {"profile_steps": args.profile_steps}),
    )
    import torch

    device_name = (
        torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu"
    )
    peak = matmul_peak("cuda" if device == "cuda" else "cpu")
    print(
        f"nanochat gpu_run: {fitness.scale.describe()}; data ready in {prep_s:.0f}s; peak {peak / 1e12:.3g} "
        f"TFLOP/s; {len(gpus)} runs in parallel",
        flush=True,
    )
    work = Path(tempfile.mkdtemp(prefix="nanochat-gpu-run-"))
    try:
        # one process per run (spawned: this one holds a CUDA context from the matmul measurement)
        options = {"rescore": args.strict_cost, "bare": args.bare, "bare_sandboxed": args.bare_sandboxed,
                   "program": str(args.program.resolve()) if args.program else None}  # fmt: skip
        runs = placement.run_on_slots(run_one, [(fitness, seed, work, options) for seed in seeds], gpus)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = summarize(runs, peak, fitness.scale, device_name)
    eval_tokens = fitness.scale.eval_tokens
    summary.update(
        {
            "train_shards": len(list(args.wiki.glob("train-*.jsonl.xz"))),
            "vocab_size": vocab,
            "seq_len": fitness.scale.seq_len,
            "eval_tokens": eval_tokens,
            "dataset": name,
            "prepare_s": prep_s,
            "torch": torch.__version__,
            "total_s": time.monotonic() - t0,
        }
    )
    write_results(out, summary, runs, markdown(summary, runs, args, eval_tokens, name))
    for run in runs:
        (out / f"seed{run['seed']}.log").write_text(
            "\n\n".join(f"== {k}\n{v}" for k, v in run["artifacts"].items())
        )
    return 0 if summary["runs_ok"] == len(runs) else 1


def write_results(out: Path, summary: dict, runs: list[dict], text: str) -> None:
    (out / "RESULTS-gpu.md").write_text(text)
    (out / "results.json").write_text(
        json.dumps({"summary": summary, "runs": runs}, indent=2, default=str)
    )
    print(text, flush=True)


def merge(args: argparse.Namespace, out: Path) -> int:
    """One summary over the runs of several calls (same scale and dataset; each keeps its peak)."""
    parts = [json.loads(path.read_text()) for path in args.merge]
    first = parts[0]["summary"]
    for part in parts[1:]:
        for key in ("scale", "budget_s", "dataset", "vocab_size", "eval_tokens", "train_shards"):
            if part["summary"].get(key) != first.get(key):
                raise SystemExit(
                    f"--merge: {key} differs ({part['summary'].get(key)!r} vs {first.get(key)!r})"
                )
    runs = gpu_script.merged_runs(part["runs"] for part in parts)
    scale = scales.resolve(
        first["scale"],
        dataset=first["dataset"],
        vocab_size=first["vocab_size"],
        budget_s=first["budget_s"],
    )
    summary = summarize(runs, first["peak_flops"], scale, first["device"])
    summary.update({k: first[k] for k in ("train_shards", "vocab_size", "seq_len", "eval_tokens")})
    summary["merged_from"] = [str(path) for path in args.merge]
    text = markdown(summary, runs, args, first["eval_tokens"], first["dataset"])
    write_results(out, summary, runs, text)
    return 0 if summary["runs_ok"] == len(runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
