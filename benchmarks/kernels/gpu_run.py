"""All GPU measurements of the kernels benchmark in one go, for RESULTS.md.

    python -m evolve.benchmarks.kernels.gpu_run [--minutes 8] [--gpus 0,1] [--smoke]
    python -m evolve.benchmarks.kernels.gpu_run --device cpu --tiny --problems rmsnorm   # CPU check

It measures (1) the machine's ceilings (calibration); (2) for every problem and
workload the reference's eager time, the torch.compile baseline T_b, the roofline T_SOL
and the reference's SOL score, each timing repeated ``--repeats`` times; (3) our Triton
seed kernels scored through the full sandboxed harness (correctness, probes, the timer),
with the coefficient of variation of their median over the repeats. Problems are shared
out over the given GPUs; a problem not started within the time budget is reported as
skipped. Results go to $OUT (or --out): results.json, results.md, log.txt.
``--tiny`` shrinks every axis to at most 64 so the whole path runs on a CPU (with
TRITON_INTERPRET=1, set by ``--device cpu``); its times mean nothing.

Against upstream's own files (``gpu_upstream.py``): ``--examples DIR`` scores each example
problem with its shipped solution (every language that builds here) in both score modes
and times the references with CUDA events and with CUPTI; ``--suite-evolve N`` then runs
``kernels_suite`` with the built-in operators over ``--suite-problems`` (aggregate
before/after); ``--no-suite-table`` skips the per-problem tables of our own suite.

``--timers DIR,...`` only times references, with CUDA events and with CUPTI on the same
inputs, for every problem under the folders (``suite`` is our own), each shrunk to every
axis at most each of ``--timer-caps`` (0: as given), so that the table reaches workloads
of a few microseconds, where the timers differ; it writes timers.json and timers.md.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from statistics import median
from typing import Any

from evolve.harness.gpus import chosen

SEEDS = {
    "rmsnorm": "rmsnorm_triton",
    "softmax": "softmax_triton",
    "silu_and_mul": "silu_mul_triton",
}
SMOKE_PROBLEMS = ("rmsnorm", "matmul_bf16")
HERE = Path(__file__).parent


def shrink_dataset(src: Path, dst: Path, cap: int = 64) -> Path:
    """Copy a dataset with every const axis and workload axis value capped at ``cap`` (for CPU runs)."""
    for definition_path in sorted(src.rglob("definition.json")):
        folder = dst / definition_path.parent.relative_to(src)
        shutil.copytree(definition_path.parent, folder, dirs_exist_ok=True)
        definition = json.loads(definition_path.read_text())
        for axis in definition["axes"].values():
            if axis["type"] == "const":
                axis["value"] = min(int(axis["value"]), cap)
        (folder / "definition.json").write_text(json.dumps(definition, indent=2))
        lines = []
        for line in (folder / "workload.jsonl").read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                record["axes"] = {k: min(int(v), cap) for k, v in record["axes"].items()}
                lines.append(json.dumps(record))
        (folder / "workload.jsonl").write_text("\n".join(lines) + "\n")
    return dst


def _log(out: Path, lock: threading.Lock, text: str) -> None:
    line = f"[{time.strftime('%H:%M:%S')}] {text}"
    with lock:
        print(line, flush=True)
        with (out / "log.txt").open("a") as handle:
            handle.write(line + "\n")


def baseline_rows(base: dict[str, Any], calibration: dict) -> dict[str, Any]:
    """Per-workload reference, baseline and SOL times and the reference's score, from referee output."""
    from .roofline import sol_ms
    from .score import coefficient_of_variation, problem_score, sol_score

    rows = []
    for uuid, entry in base.items():
        if "error" in entry:
            rows.append({"uuid": uuid, "error": entry["error"]})
            continue
        ref = [median(t) for t in entry["reference_ms"]]
        compiled = [median(t) for t in entry.get("baseline_ms", [])] or ref
        sol = sol_ms(entry["bytes"], entry.get("flops", {}), calibration)
        t_ref, t_b = median(ref), median(compiled)
        rows.append({
            "uuid": uuid, "reference_ms": t_ref, "baseline_ms": t_b, **sol, "bytes": entry["bytes"],
            "flops": entry.get("flops", {}), "reference_score": sol_score(t_ref, t_b, sol["sol_ms"]),
            "reference_cv": coefficient_of_variation(ref), "baseline_cv": coefficient_of_variation(compiled),
            "compile_error": entry.get("compile_error"),
        })  # fmt: skip
    return {
        "workloads": rows,
        "reference_score": problem_score([r.get("reference_score") for r in rows]),
    }


def run_seed(
    name: str, dataset: Path, settings: Any, calibration: dict, base: dict, env: dict
) -> dict[str, Any]:
    """Our Triton seed for ``name`` through the full sandboxed harness."""
    from .harness import Harness
    from .spec import find_problem
    from .suite import stage

    problem = find_problem(dataset, name)
    harness = Harness(problem, settings, calibration=calibration, baselines=base)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"evolve-kernels-seed-{name}-") as tmp:
        stage(
            HERE / "seeds" / SEEDS[name],
            Path(tmp),
            (problem.root / "definition.json").read_text(),
            problem.definition.reference,
        )
        report = harness.evaluate(Path(tmp), env=env)
    return {"name": SEEDS[name], "seconds": time.monotonic() - started, **report.as_dict()}


def run_evolve(
    args: Any, out: Path, dataset: Path, gpus: list, device: str, log: Any
) -> dict[str, Any]:
    """An evolve run on rmsnorm from our Triton seed with the built-in operators; its seed and best scores."""
    from .gpu_upstream import archive_summary, run_bounded

    run_dir = out / "evolve_rmsnorm"
    command = [sys.executable, "-m", "evolve", "benchmark=kernels_rmsnorm", f"search.max_candidates={args.evolve}",
               f"search.max_wall_s={int(args.evolve_minutes * 60)}", "search.progress=false",
               f"benchmark.fitness.calibration={out / 'calibration.json'}", f"hydra.run.dir={run_dir}"]  # fmt: skip
    if args.tiny:
        command += [f"benchmark.fitness.dataset={dataset}"]
    if device == "cpu":
        command += ["benchmark.fitness.device=cpu", "benchmark.fitness.baseline=eager", "+benchmark.fitness.rounds=2",
                    "+benchmark.fitness.warmup=1", "+benchmark.fitness.iters=5"]  # fmt: skip
    env = dict(os.environ)
    if device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    log(f"evolve: {' '.join(command)}")
    started = time.monotonic()
    # max_wall_s stops new proposals; the evaluations in flight then finish (about 30 s each on a GPU)
    returncode, output = run_bounded(command, env, args.evolve_minutes * 60 + 240)
    (out / "evolve_log.txt").write_text(output)
    result: dict[str, Any] = {
        "command": " ".join(command),
        "returncode": returncode,
        "seconds": time.monotonic() - started,
    }
    result.update(archive_summary(run_dir / "archive.db"))
    log(f"evolve: {result}")
    return result


def markdown(results: dict[str, Any]) -> str:
    """RESULTS.md text: calibration, per-problem baselines and SOL, seeds with their spread."""
    cal = results["calibration"]
    rates = cal["matrix_flops_per_s"]
    out = [
        f"### Run of {results['started']} on {cal['device']} (torch {cal['torch']}), {results['seconds']:.0f} s",
        "",
    ]
    out += ["| ceiling | measured |", "| --- | ---: |",
            f"| bandwidth used for SOL | {cal['bandwidth_bytes_per_s'] / 1e12:.3f} TB/s |",
            f"| copy (read + write) | {cal['copy_bytes_per_s'] / 1e12:.3f} TB/s |",
            f"| read (sum) | {cal['read_bytes_per_s'] / 1e12:.3f} TB/s |"]  # fmt: skip
    out += [f"| {k} matmul | {v / 1e12:.1f} TFLOP/s |" for k, v in rates.items()]
    out += ["", "| problem | workload | T_ref ms | T_b (compile) ms | T_SOL ms | bound | reference score | CV(T_b) |",
            "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: |"]  # fmt: skip
    for p in results["problems"]:
        if "error" in p or "skipped" in p:
            out.append(f"| {p['problem']} | {p.get('error') or p.get('skipped')} | | | | | | |")
            continue
        for r in p["workloads"]:
            if "error" in r:
                out.append(
                    f"| {p['problem']} | {r['uuid']} | failed: {r['error'][:100]} | | | | | |"
                )
                continue
            bound = "memory" if r["memory_ms"] >= r["compute_ms"] else "compute"
            note = " (compile failed)" if r.get("compile_error") else ""
            out.append(f"| {p['problem']} | {r['uuid']} | {r['reference_ms']:.4f} | {r['baseline_ms']:.4f}{note} | {r['sol_ms']:.4f} | "
                       f"{bound} | {r['reference_score']:.3f} | {r['baseline_cv']:.2%} |")  # fmt: skip
    out += ["", "| problem | reference score (mean over workloads) |", "| --- | ---: |"]
    out += [
        f"| {p['problem']} | {p['reference_score']:.3f} |"
        for p in results["problems"]
        if "reference_score" in p
    ]
    out += ["", "| seed kernel | workload | status | T_k ms | T_b ms | T_SOL ms | score | CV of median |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for p in results["problems"]:
        seed = p.get("seed")
        if not seed:
            continue
        for r in seed["rows"]:
            cells = [r.get(k) for k in ("kernel_ms", "baseline_ms", "sol_ms", "score", "cv")]
            fmt = [("-" if c is None else f"{c:.4f}") for c in cells[:4]] + [
                "-" if cells[4] is None else f"{cells[4]:.2%}"
            ]
            out.append(f"| {seed['name']} | {r['uuid']} | {r['status']} | {' | '.join(fmt)} |")
        out.append(
            f"| **{seed['name']}** | problem score | {seed['status']} | | | | **{seed['score']:.3f}** | |"
        )
    cvs = [
        r["cv"]
        for p in results["problems"]
        for r in (p.get("seed") or {}).get("rows", [])
        if r.get("cv") is not None
    ]
    if cvs:
        out += ["", f"Spread: CV of the median over {results['settings']['repeats']} repeats, max {max(cvs):.2%}, "
                    f"mean {sum(cvs) / len(cvs):.2%} (goal < 2%)."]  # fmt: skip
    evo = results.get("evolve")
    if evo:
        out += ["", f"Evolve run on rmsnorm from `rmsnorm_triton`, built-in operators (`{evo['command']}`): "
                    f"{evo.get('evaluated', 0)} evaluated ({evo.get('ok', 0)} ok) in {evo['seconds']:.0f} s; "
                    f"seed score {evo.get('seed_score') or 0:.4g} -> best {evo.get('best_score') or 0:.4g} "
                    f"({evo.get('best_description') or '-'})."]  # fmt: skip
    return "\n".join(out) + "\n"


def time_references(roots: list[Path], caps: list[int], workloads: int, settings: Any, env: dict,
                    tmp: Path) -> list[dict[str, Any]]:  # fmt: skip
    """Events vs CUPTI rows for the problems under ``roots``, once per axis cap (0: unchanged)."""
    from .gpu_upstream import compare_timers

    shrunk = [root if cap == 0 else shrink_dataset(root, tmp / f"timers-cap{cap}" / f"{i}-{root.name}", cap)
              for cap in caps for i, root in enumerate(roots)]  # fmt: skip
    return compare_timers(shrunk, settings, env, workloads)


def timers_only(args: Any, settings: Any, env: dict, out: Path, tmp: Path, log: Any) -> int:
    """``--timers``: the timer comparison alone; timers.json and timers.md in ``out``."""
    from .fitness import SUITE
    from .gpu_upstream import timer_table

    roots = [SUITE if r == "suite" else Path(r).resolve() for r in args.timers.split(",") if r]
    caps = [int(c) for c in args.timer_caps.split(",") if c]
    log(
        f"timers: {[str(r) for r in roots]}, axis caps {caps}, {args.timer_workloads} workload(s) per problem"
    )
    rows = time_references(roots, caps, args.timer_workloads, settings, env, tmp)
    (out / "timers.json").write_text(json.dumps(rows, indent=2, default=str))
    text = timer_table(rows) + "\n"
    (out / "timers.md").write_text(text)
    print(text)
    paired = [r for r in rows if "events_ms" in r and "cupti_ms" in r]
    log(f"timers: {len(paired)} of {len(rows)} workloads timed both ways")
    return 0 if paired else 1


def upstream_phase(args: Any, full: dict, settings: Any, calibration: dict, env: dict, out: Path, tmp: Path,
                   log: Any) -> None:  # fmt: skip
    """Upstream's examples with their own solutions, events vs CUPTI, and a suite evolve run."""
    from dataclasses import replace

    from . import gpu_upstream

    if args.examples:
        examples = Path(args.examples).resolve()
        quick = replace(settings, rounds=min(settings.rounds, 3), repeats=1)
        full["examples"] = gpu_upstream.score_examples(
            examples, quick, calibration, env, log, args.example_workloads
        )
        try:
            caps = [int(c) for c in args.timer_caps.split(",") if c]
            full["timers"] = time_references(
                [examples], caps, args.timer_workloads, settings, env, tmp
            )
        except Exception as exc:  # the table is still written without it
            full["timers"] = []
            log(f"timers FAILED: {exc}")
    if args.suite_evolve:
        problems = [p for p in args.suite_problems.split(",") if p]
        run_env = {**os.environ, **env}
        full["suite_evolve"] = gpu_upstream.run_suite_evolve(problems, args.suite_evolve, args.suite_minutes, out,
                                                             out / "calibration.json", run_env, log)  # fmt: skip
    text = gpu_upstream.markdown(
        full.get("examples", []), full.get("timers", []), full.get("suite_evolve")
    )
    (out / "upstream.md").write_text(text)
    print(text)


def main(argv: list[str] | None = None) -> int:
    """Run everything; print the Markdown table; write results into $OUT."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--minutes",
        type=float,
        default=8.0,
        help="time budget; problems not started by then are skipped",
    )
    parser.add_argument(
        "--gpus", default="0", help="comma-separated GPU indices to share problems over"
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="two problems, one workload each, fewer iterations (< 2 min)",
    )
    parser.add_argument(
        "--device",
        default="cuda",
        choices=("cuda", "cpu"),
        help="cpu: Triton interpreter, eager baseline",
    )
    parser.add_argument("--tiny", action="store_true", help="cap every axis at 64 (for CPU runs)")
    parser.add_argument("--problems", help="comma-separated subset")
    parser.add_argument("--dataset", help="problems folder (default: our suite)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu_run_out")
    parser.add_argument(
        "--evolve",
        type=int,
        default=0,
        metavar="N",
        help="then run evolve on rmsnorm from the Triton seed (built-in operators) for N candidates",
    )
    parser.add_argument(
        "--evolve-minutes", type=float, default=5.0, help="wall-clock cap of that evolve run"
    )
    parser.add_argument(
        "--examples", help="folder of upstream example problems, each with a solution_*.json"
    )
    parser.add_argument(
        "--example-workloads", type=int, default=1, help="workloads scored per example"
    )
    parser.add_argument(
        "--suite-evolve",
        type=int,
        default=0,
        metavar="N",
        help="kernels_suite evolve run of N candidates",
    )
    parser.add_argument("--suite-problems", default="add_rmsnorm,cross_entropy,fp8_quant_token,layernorm,rmsnorm,"
                        "rotary_embedding,silu_and_mul,softmax", help="problems of that suite run")  # fmt: skip
    parser.add_argument(
        "--suite-minutes", type=float, default=4.0, help="wall-clock cap of the suite run"
    )
    parser.add_argument(
        "--no-suite-table", action="store_true", help="skip our suite's baseline and seed tables"
    )
    parser.add_argument("--timers", metavar="DIR,...",
                        help="only time references with events and CUPTI, for the problems under these folders "
                             "('suite': ours)")  # fmt: skip
    parser.add_argument("--timer-caps", default="16,256,0",
                        help="axis caps of the timer comparison (0: the workloads as given)")  # fmt: skip
    parser.add_argument(
        "--timer-workloads", type=int, default=1, help="workloads timed per problem and cap"
    )
    args = parser.parse_args(argv)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()

    def log(text: str) -> None:
        _log(out, lock, text)

    from .fitness import SUITE, resolve_device
    from .harness import Harness, Settings
    from .spec import problem_dirs

    device = resolve_device(args.device)
    started, clock = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), time.monotonic()
    dataset = Path(args.dataset or SUITE)
    tmp = Path(tempfile.mkdtemp(prefix="evolve-kernels-gpu-run-"))
    if args.timers:
        env = {"CUDA_VISIBLE_DEVICES": chosen(args.gpus)[0]} if device == "cuda" else {}
        code = timers_only(args, Settings(device=device), env, out, tmp, log)
        shutil.rmtree(tmp, ignore_errors=True)
        return code
    if args.tiny:
        dataset = shrink_dataset(dataset, tmp / "tiny")
    names = sorted(problem_dirs(dataset))
    if args.no_suite_table:
        names = names[:1]  # the calibration needs one problem; no tables for ours
    elif args.problems:
        names = [n for n in names if n in args.problems.split(",")]
    elif args.smoke:
        names = [n for n in names if n in SMOKE_PROBLEMS]
    # --gpus indexes the GPUs this process may use (the harness layer's placement)
    gpus: list[str | None] = list(chosen(args.gpus)) if device == "cuda" else [None]
    small = args.smoke or device == "cpu"
    settings = Settings(device=device, rounds=2 if small else 10, warmup=2 if small else 10, iters=10 if small else 50,
                        repeats=2 if small else args.repeats, baseline="eager" if device == "cpu" else "compile",
                        quick_calibration=device == "cpu", timeout_s=600.0)  # fmt: skip
    log(
        f"device {device}, GPUs {gpus}, {len(names)} problems, budget {args.minutes} min, settings {settings}"
    )
    first_env = {"CUDA_VISIBLE_DEVICES": gpus[0]} if gpus[0] is not None else {}
    from .spec import find_problem

    calibration = Harness(find_problem(dataset, names[0]), settings).calibration(first_env)
    (out / "calibration.json").write_text(json.dumps(calibration, indent=2))
    log(f"calibration: {json.dumps(calibration)}")
    from dataclasses import replace

    from .harness import referee_call

    # Phase 1: one referee process per GPU measures the baselines of its share of the problems
    # (one torch import and one inductor warm-up per GPU, not per problem).
    order = sorted(
        names, key=lambda n: (n not in SEEDS, n)
    )  # seed problems first: they are must-show
    shares = {g: order[i :: len(gpus)] for i, g in enumerate(gpus)}
    baselines: dict[str, Any] = {}
    results: dict[str, Any] = {}
    budget_s = args.minutes * 60

    def baseline_worker(gpu: str | None) -> None:
        env = {"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {}
        items = []
        for name in shares[gpu]:
            problem = find_problem(dataset, name)
            chosen = [problem.workloads[0].uuid] if args.smoke else None
            items.append({"problem_dir": str(problem.root), "workloads": chosen})
        job = {"task": "baseline", "problems": items, "warmup": settings.warmup, "iters": settings.iters,
               "baseline": settings.baseline, "seed": 0, "repeats": settings.repeats,
               "deadline_s": max(30.0, 0.75 * budget_s - (time.monotonic() - clock))}  # fmt: skip
        try:
            payload = referee_call(job, settings, env)["problems"]
        except Exception as exc:
            for name in shares[gpu]:
                results[name] = {
                    "problem": name,
                    "error": f"{type(exc).__name__}: {str(exc)[:800]}",
                }
            log(f"GPU {gpu}: baselines FAILED: {exc}")
            return
        for name, entry in payload.items():
            if "skipped" in entry or "error" in entry:
                results[name] = {
                    "problem": name,
                    **{k: entry[k] for k in ("skipped", "error") if k in entry},
                }
                continue
            baselines[name] = entry["workloads"]
            results[name] = {"problem": name, **baseline_rows(entry["workloads"], calibration)}
            log(
                f"{name}: reference score {results[name]['reference_score']:.3f} (done at {entry['seconds']:.0f} s on GPU {gpu})"
            )

    threads = [threading.Thread(target=baseline_worker, args=(g,)) for g in gpus]
    for t in threads if not args.no_suite_table else ():
        t.start()
    for t in threads if not args.no_suite_table else ():
        t.join()

    # Phase 2: our Triton seeds through the full harness (correctness, probes, repeats, timed by the timer).
    todo: queue.Queue[str] = queue.Queue()
    for name in order:
        if name in SEEDS and name in baselines:
            todo.put(name)

    def seed_worker(gpu: str | None) -> None:
        env = {"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {}
        while True:
            try:
                name = todo.get_nowait()
            except queue.Empty:
                return
            if time.monotonic() - clock > budget_s:
                results[name]["seed"] = {
                    "name": SEEDS[name],
                    "status": "skipped",
                    "score": 0.0,
                    "rows": [],
                    "message": "time budget",
                }
                continue
            chosen = replace(settings, workloads=tuple(baselines[name])) if args.smoke else settings
            try:
                results[name]["seed"] = run_seed(
                    name, dataset, chosen, calibration, baselines[name], env
                )
                seed = results[name]["seed"]
                log(
                    f"{name}: seed {seed['name']} status {seed['status']} score {seed['score']:.3f} {seed['message'][:300]}"
                )
            except Exception as exc:
                results[name]["seed"] = {
                    "name": SEEDS[name],
                    "status": "error",
                    "score": 0.0,
                    "rows": [],
                    "message": str(exc)[:800],
                }
                log(f"{name}: seed FAILED {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=seed_worker, args=(g,)) for g in gpus]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    full = {"started": started, "device": device, "gpus": gpus, "tiny": args.tiny, "smoke": args.smoke,
            "settings": settings.__dict__ | {"workloads": list(settings.workloads)}, "calibration": calibration,
            "problems": [results.get(n, {"problem": n, "skipped": "no result"}) for n in sorted(names)]}  # fmt: skip

    def write() -> str:
        full["seconds"] = time.monotonic() - clock
        (out / "results.json").write_text(json.dumps(full, indent=2, default=str))
        text = markdown(full)
        (out / "results.md").write_text(text)
        return text

    if args.no_suite_table:
        full["problems"] = []
    write()  # written before the evolve phase too, so a cut-off run still leaves its results
    if args.examples or args.suite_evolve:
        upstream_phase(args, full, settings, calibration, first_env, out, tmp, log)
        write()
    if args.evolve:
        full["evolve"] = run_evolve(args, out, dataset, gpus, device, log)
    shutil.rmtree(tmp, ignore_errors=True)
    print(write())
    failed = [
        p["problem"]
        for p in full["problems"]
        if "error" in p or (p.get("seed") or {}).get("status", "ok") != "ok"
    ] + [e["folder"] for e in full.get("examples", []) if e["status"] != "ok"]
    log(f"done in {full['seconds']:.0f} s; failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
