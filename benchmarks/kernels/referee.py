"""The harness's own GPU process (no candidate code): calibration, baselines, roofline, witness checks.

Run through ``run_sandboxed`` as ``python -P -m evolve.benchmarks.kernels.referee``; it talks
the harness layer's protocol (``evolve.harness.protocol``: the job with a nonce on stdin, the
verdict as the JSON line carrying it). Tasks:

- ``calibrate``: the machine's bandwidth and matrix rates;
- ``baseline``: per workload, timings of the reference in eager mode and under
  ``torch.compile`` (the baseline T_b), its unavoidable bytes and its matrix FLOPs;
- ``timers``: the reference of each workload timed with CUDA events and with CUPTI;
- ``witness``: re-create the inputs of calls the driver audited, run the reference on
  them here, and compare with the outputs the candidate's process saved.
"""

from __future__ import annotations

import importlib
import traceback
from pathlib import Path
from typing import Any

from evolve.benchmarks.kernels.process import exit_now

from evolve.harness.protocol import serve_job

PREPARED_MODULES = (
    "torch",
    "evolve.benchmarks.kernels.compare",
    "evolve.benchmarks.kernels.inputs",
    "evolve.benchmarks.kernels.pool",
    "evolve.benchmarks.kernels.roofline",
    "evolve.benchmarks.kernels.spec",
    "evolve.benchmarks.kernels.timing",
)


def _measure_workload(
    job: dict[str, Any], problem: Any, workload: Any, reference: Any, state: dict[str, Any]
) -> dict[str, Any]:
    """Bytes, FLOPs, eager and compiled timings of the reference on one workload."""
    import torch
    from evolve.benchmarks.kernels import inputs, pool, roofline, timing

    device = torch.device(job["device"])
    maker = inputs.InputMaker(problem, workload, device, reference)
    entry: dict[str, Any] = {"bytes": maker.input_bytes() + maker.output_bytes()}
    entry["flops"], entry["flops_method"] = roofline.flops_with_fallback(problem, maker, reference)

    if job.get("inputs", "shifted") == "shifted":  # as the candidate's timed calls (pool.py)
        base = maker.make(inputs.derive_seed(job["seed"], workload.uuid, "baseline"))
        shifted = pool.ShiftedInputs(base, int(job["warmup"]) + int(job["iters"]))

        def setup(i: int) -> list[Any]:
            return shifted.get(int(job["warmup"]) + i if i >= 0 else -1 - i)
    else:

        def setup(i: int) -> list[Any]:
            return maker.make(inputs.derive_seed(job["seed"], workload.uuid, "baseline", i))

    kwargs = {"device": device, "warmup": job["warmup"], "iters": job["iters"], "flush_l2": True,
              "method": job.get("timer", "events")}  # fmt: skip
    repeats = int(job.get("repeats", 1))
    with torch.no_grad():
        entry["reference_ms"] = [
            timing.measure(reference.run, setup, **kwargs) for _ in range(repeats)
        ]
        entry["timer"] = timing.last_timer()
        if job["baseline"] == "compile":
            try:
                if "compiled" not in state:
                    state["compiled"] = torch.compile(reference.run, dynamic=False)
                entry["baseline_ms"] = [
                    timing.measure(state["compiled"], setup, **kwargs) for _ in range(repeats)
                ]
            except Exception as exc:  # T_b falls back to the eager reference; the report says so
                entry["compile_error"] = f"{type(exc).__name__}: {str(exc)[:2000]}"
    return entry


def _baseline(job: dict[str, Any]) -> dict[str, Any]:
    """Baselines of one problem (``problem_dir``) or several (``problems``), within ``deadline_s``."""
    import time

    import torch
    from evolve.benchmarks.kernels import inputs, spec

    start = time.monotonic()
    wanted = job.get("problems") or [
        {"problem_dir": job["problem_dir"], "workloads": job.get("workloads")}
    ]
    results: dict[str, Any] = {}
    for item in wanted:
        problem = spec.load_problem(item["problem_dir"])
        if job.get("deadline_s") and time.monotonic() - start > float(job["deadline_s"]):
            results[problem.name] = {"skipped": "not started within the time budget"}
            continue
        try:
            reference = inputs.load_reference(problem.definition, Path(job["harness_dir"]))
        except Exception as exc:
            results[problem.name] = {
                "error": f"the reference does not load: {type(exc).__name__}: {exc}"
            }
            continue
        out: dict[str, Any] = {}
        state: dict[str, Any] = {}
        for workload in problem.workloads:
            if item.get("workloads") and workload.uuid not in item["workloads"]:
                continue
            try:
                out[workload.uuid] = _measure_workload(job, problem, workload, reference, state)
            except (
                Exception
            ) as exc:  # one workload failing (out of memory...) must not lose the others
                out[workload.uuid] = {"error": f"{type(exc).__name__}: {str(exc)[:1000]}"}
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        results[problem.name] = {"workloads": out, "seconds": time.monotonic() - start}
    if "problems" in job:
        return {"problems": results}
    return next(iter(results.values()))


def _witness(job: dict[str, Any]) -> dict[str, Any]:
    import torch
    from evolve.benchmarks.kernels import compare, inputs, spec

    problem = spec.load_problem(job["problem_dir"])
    device = torch.device(job["device"])
    reference = inputs.load_reference(problem.definition, Path(job["harness_dir"]))
    out: dict[str, Any] = {}
    for item in job["witnesses"]:
        workload = problem.workload(item["uuid"])
        maker = inputs.InputMaker(problem, workload, device, reference)
        path = Path(item["file"])
        # a FIFO put in its place would block open() for good; a link could lead anywhere
        if path.is_symlink() or not path.is_file():
            out[item["uuid"]] = {"error": "the witness file is not a regular file"}
            continue
        try:  # the candidate's process can write anything there
            saved = torch.load(path, map_location=device, weights_only=True)
            seed, got = int(saved["seed"]), list(saved["outputs"])
            if not all(isinstance(g, torch.Tensor) for g in got):
                raise TypeError("an output is not a tensor")
        except Exception as exc:
            out[item["uuid"]] = {"error": f"the witness file does not hold saved outputs "
                                          f"({type(exc).__name__}: {str(exc)[:200]})"}  # fmt: skip
            continue
        if seed != int(item["seed"]):
            out[item["uuid"]] = {
                "error": "the witness file holds outputs for other inputs than reported"
            }
            continue
        with torch.no_grad():
            ref = maker.normalize(reference.run(*maker.make(seed)))
        if len(got) != len(ref):
            out[item["uuid"]] = {
                "error": f"witness has {len(got)} outputs, the definition {len(ref)}"
            }
            continue
        out[item["uuid"]] = {
            "stats": [
                compare.error_stats(g, r, workload.tolerance) for g, r in zip(got, ref, strict=True)
            ]
        }
    return {"witness": out}


def _timers(job: dict[str, Any]) -> dict[str, Any]:
    """The reference of each workload timed twice on the same shifted inputs: CUDA events, then CUPTI.

    ``problems`` are folders; ``workloads`` (optional) how many of each problem's workloads.
    """
    import torch
    from evolve.benchmarks.kernels import inputs, pool, spec, timing

    device = torch.device(job["device"])
    calls = int(job["warmup"]) + int(job["iters"])
    rows = []
    for item in job["problems"]:
        try:
            problem = spec.load_problem(item)
            reference = inputs.load_reference(problem.definition, Path(job["harness_dir"]))
        except Exception as exc:  # one problem failing must not lose the others' rows
            error = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append({"problem": Path(item).name, "folder": str(item), "uuid": "-", "events_error": error,
                         "cupti_error": error})  # fmt: skip
            continue
        for workload in problem.workloads[: job.get("workloads") or None]:
            row: dict[str, Any] = {
                "problem": problem.name,
                "folder": str(item),
                "uuid": workload.uuid,
            }
            try:
                maker = inputs.InputMaker(problem, workload, device, reference)
                row["axes"] = dict(maker.axes)
                shifted = pool.ShiftedInputs(maker.make(1), 2 * calls)
            except Exception as exc:
                row["events_error"] = row["cupti_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                rows.append(row)
                continue
            for offset, method in ((0, "events"), (calls, "cupti")):
                row[f"{method}_timer"] = timing.resolve_timer(method, device)

                def setup(i: int, offset: int = offset, shifted: Any = shifted) -> list[Any]:
                    return shifted.get(offset + (job["warmup"] + i if i >= 0 else -1 - i))

                try:
                    with torch.no_grad():
                        times = timing.measure(reference.run, setup, device=device, warmup=job["warmup"],
                                               iters=job["iters"], method=method)  # fmt: skip
                    row[f"{method}_ms"] = timing.median(times)
                    row[f"{method}_timer"] = timing.last_timer()
                    row[f"{method}_activities"] = timing.last_activities()
                except Exception as exc:
                    row[f"{method}_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append(row)
            del shifted
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return {"timers": rows}


def _calibrate(job: dict[str, Any]) -> dict[str, Any]:
    import torch
    from evolve.benchmarks.kernels.calibrate import calibrate

    return {"calibration": calibrate(torch.device(job["device"]), quick=bool(job.get("quick")))}


TASKS = {"baseline": _baseline, "witness": _witness, "calibrate": _calibrate, "timers": _timers}


def main() -> int:
    """Serve one job through the harness layer's protocol (nonce'd JSON line in, verdict out)."""

    def run(job: dict[str, Any]) -> dict[str, Any]:
        try:
            payload = TASKS[job["task"]](job)
        except Exception as exc:
            payload = {
                "fatal": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-4000:],
            }
        print(flush=True)  # the verdict starts a line of its own, whatever a library printed before
        return payload

    prepare()
    serve_job(run)
    return 0


def prepare() -> None:
    """Import what every task needs before the job is read: a referee started ahead of its task
    (``process.prepare_referee``) does this while the candidate runs."""
    for name in PREPARED_MODULES:
        importlib.import_module(name)


if __name__ == "__main__":
    exit_now(main())
