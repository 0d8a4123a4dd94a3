"""The harness's own GPU process (no candidate code): calibration, baselines, roofline, timer checks.

Run through ``run_sandboxed`` as ``python -P -m evolve.benchmarks.kernels.referee``; it talks
the harness layer's protocol (``evolve.harness.protocol``: the job with a nonce on stdin, the
verdict as the JSON line carrying it). Tasks:

- ``calibrate``: the machine's bandwidth and matrix rates;
- ``baseline``: per workload, timings of the reference in eager mode and under
  ``torch.compile`` (the baseline T_b), measured exactly as a candidate is (``timer.py``:
  the reference hosted in a process of its own, batches timed from this one), its
  unavoidable bytes and its matrix FLOPs;
- ``timers``: the reference of each workload timed in this process with CUDA events and with
  CUPTI, one call at a time (a diagnostic of the two GPU timers).
"""

from __future__ import annotations

import importlib
import traceback
from pathlib import Path
from typing import Any

from evolve.harness.protocol import serve_job

from .process import exit_now

PREPARED_MODULES = (
    "torch",
    "evolve.benchmarks.kernels.compare",
    "evolve.benchmarks.kernels.inputs",
    "evolve.benchmarks.kernels.pool",
    "evolve.benchmarks.kernels.roofline",
    "evolve.benchmarks.kernels.spec",
    "evolve.benchmarks.kernels.timing",
    "evolve.benchmarks.kernels.timer",
    "evolve.benchmarks.kernels.arena",
    "evolve.benchmarks.kernels.wire",
)


def _measure_workload(job: dict[str, Any], problem: Any, workload: Any, reference: Any,
                      sessions: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """Bytes, FLOPs, eager and compiled timings of the reference on one workload."""
    import torch

    from . import inputs, roofline, timer

    device = torch.device(job["device"])
    maker = inputs.InputMaker(problem, workload, device, reference)
    entry: dict[str, Any] = {"bytes": maker.input_bytes() + maker.output_bytes(), "timer": "host"}
    entry["flops"], entry["flops_method"] = roofline.flops_with_fallback(problem, maker, reference)
    entry["reference_ms"] = timer.time_reference(sessions["eager"], job, problem, workload, reference)
    if "compile" in sessions:
        try:
            entry["baseline_ms"] = timer.time_reference(sessions["compile"], job, problem, workload, reference)
        except (timer.Failed, timer.RunnerGone) as exc:  # T_b falls back to the eager reference; the report says so
            entry["compile_error"] = str(exc)[:2000]
    return entry


def _sessions(job: dict[str, Any], problem: Any) -> dict[str, Any]:
    """Processes hosting the problem's reference (eager, and compiled for ``baseline=compile``),
    each timed from this process as a candidate's is."""
    from . import timer

    sessions = {}
    for kind in ("eager", "compile") if job["baseline"] == "compile" else ("eager",):
        session = timer.Session(job["device"], cwd=Path(job["harness_dir"]))
        sessions[kind] = session
        load = {"op": "load", "entry": {"reference": kind}, "outputs": list(problem.definition.outputs),
                "problem_dir": str(problem.root), "harness_dir": job["harness_dir"]}  # fmt: skip
        timer.check_answer(session.ask(load), f"loading the {kind} reference")
    return sessions


def _baseline(job: dict[str, Any]) -> dict[str, Any]:
    """Baselines of one problem (``problem_dir``) or several (``problems``), within ``deadline_s``."""
    import time

    import torch

    from . import inputs, spec

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
        sessions: dict[str, Any] = {}
        try:
            sessions = _sessions(job, problem)
            for workload in problem.workloads:
                if item.get("workloads") and workload.uuid not in item["workloads"]:
                    continue
                try:
                    out[workload.uuid] = _measure_workload(job, problem, workload, reference, sessions)
                except Exception as exc:  # one workload failing (out of memory...) must not lose the others
                    out[workload.uuid] = {"error": f"{type(exc).__name__}: {str(exc)[:1000]}"}
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
        except Exception as exc:  # the reference's process did not start or load
            results[problem.name] = {"error": f"the reference's process failed: {type(exc).__name__}: {exc}"}
            continue
        finally:
            for session in sessions.values():
                session.close()
        results[problem.name] = {"workloads": out, "seconds": time.monotonic() - start}
    if "problems" in job:
        return {"problems": results}
    return next(iter(results.values()))


def _timers(job: dict[str, Any]) -> dict[str, Any]:
    """The reference of each workload timed twice on the same shifted inputs: CUDA events, then CUPTI.

    ``problems`` are folders; ``workloads`` (optional) how many of each problem's workloads.
    """
    import torch

    from . import inputs, pool, spec, timing

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

    from .calibrate import calibrate

    return {"calibration": calibrate(torch.device(job["device"]), quick=bool(job.get("quick")))}


TASKS = {"baseline": _baseline, "calibrate": _calibrate, "timers": _timers}


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
