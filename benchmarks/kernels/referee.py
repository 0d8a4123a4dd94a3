"""The harness's own GPU process (no candidate code): calibration, baselines, roofline, witness checks.

Run through ``run_sandboxed`` as ``python -m evolve.benchmarks.kernels.referee`` with a
job (JSON) on stdin; prints one JSON line prefixed by ``RESULT_TAG``. Tasks:

- ``calibrate``: the machine's bandwidth and matrix rates;
- ``baseline``: per workload, timings of the reference in eager mode and under
  ``torch.compile`` (the baseline T_b), its unavoidable bytes and its matrix FLOPs;
- ``witness``: re-create the inputs of calls the driver audited, run the reference on
  them here, and compare with the outputs the candidate's process saved.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

RESULT_TAG = "EVOLVE_KERNELS_REFEREE "


def _baseline(job: dict[str, Any]) -> dict[str, Any]:
    import torch
    from evolve.benchmarks.kernels import inputs, roofline, spec, timing

    problem = spec.load_problem(job["problem_dir"])
    device = torch.device(job["device"])
    reference = inputs.load_reference(problem.definition, Path(job["harness_dir"]))
    out: dict[str, Any] = {}
    compiled = None
    for workload in problem.workloads:
        if job.get("workloads") and workload.uuid not in job["workloads"]:
            continue
        maker = inputs.InputMaker(problem, workload, device, reference)
        entry: dict[str, Any] = {"bytes": maker.input_bytes() + maker.output_bytes()}
        try:
            entry["flops"] = roofline.count_flops(problem, maker, reference)
        except (
            Exception
        ) as exc:  # a reference that cannot run on meta tensors: memory roofline only
            entry["flops"] = {}
            entry["flops_error"] = f"{type(exc).__name__}: {exc}"

        def setup(i: int, maker: Any = maker, uuid: str = workload.uuid) -> list[Any]:
            return maker.make(inputs.derive_seed(job["seed"], uuid, "baseline", i))

        kwargs = {
            "device": device,
            "warmup": job["warmup"],
            "iters": job["iters"],
            "flush_l2": True,
        }
        with torch.no_grad():
            entry["reference_ms"] = [
                timing.measure(reference.run, setup, **kwargs) for _ in range(job.get("repeats", 1))
            ]
            if job["baseline"] == "compile":
                try:
                    compiled = compiled or torch.compile(reference.run, dynamic=False)
                    entry["baseline_ms"] = [
                        timing.measure(compiled, setup, **kwargs)
                        for _ in range(job.get("repeats", 1))
                    ]
                except Exception as exc:
                    entry["compile_error"] = f"{type(exc).__name__}: {str(exc)[:2000]}"
        out[workload.uuid] = entry
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"workloads": out}


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
        saved = torch.load(item["file"], map_location=device, weights_only=True)
        if int(saved["seed"]) != int(item["seed"]):
            out[item["uuid"]] = {
                "error": "the witness file holds outputs for other inputs than reported"
            }
            continue
        with torch.no_grad():
            ref = maker.normalize(reference.run(*maker.make(int(item["seed"]))))
        got = saved["outputs"]
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


def _calibrate(job: dict[str, Any]) -> dict[str, Any]:
    import torch
    from evolve.benchmarks.kernels.calibrate import calibrate

    return {"calibration": calibrate(torch.device(job["device"]), quick=bool(job.get("quick")))}


TASKS = {"baseline": _baseline, "witness": _witness, "calibrate": _calibrate}


def main() -> int:
    """Read the job from stdin, run its task, print the result line."""
    real_stdout = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    job = json.loads(sys.stdin.read())
    try:
        payload = TASKS[job["task"]](job)
    except Exception as exc:
        payload = {
            "fatal": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc()[-4000:],
        }
    real_stdout.write(RESULT_TAG + json.dumps(payload) + "\n")
    real_stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
