"""The process that runs a candidate kernel: correctness rounds, audited timing, anti-cheat checks.

Run only by the harness (``process.prepare_driver``) as ``python -P -m
evolve.benchmarks.kernels.driver DEVICE`` in a folder of the harness's, into which the
candidate's files are copied once this process has imported torch and the harness's modules
(it may be started before its candidate is known); the job (JSON) then arrives on stdin. It
prepares everything it relies on (clock, input maker, reference, function identities, C++
blockers) *before* importing the candidate module, then for each workload:

1. ``rounds`` correctness rounds, each on fresh inputs from its own seed: the reference
   runs on one copy, the candidate (destination-passing: ``run(*inputs, *outputs)``)
   on another, into NaN-filled outputs; raw error stats are recorded per output;
2. a profiled call records the kernels the candidate launches;
3. ``repeats`` timing loops (warm-up, ``iters`` timed calls, L2 flushed, fresh inputs
   and outputs every call); at unpredictable iterations the timed call's outputs are
   checked against the reference on the same inputs, one of them is saved as a
   witness for the harness's own check, the others are probes whose inputs have half
   their rows changed (``pool.perturb_rows``), and an extra profiled call must launch
   the same kernels as before.

Correctness rounds put their fresh values at the same addresses every round
(``pool.RecurringAddresses``). The seed the job carries is drawn by the harness per
evaluation, so no input can be predicted from the candidate's ``EVOLVE_SEED``.

It prints one JSON line (prefixed by ``RESULT_TAG``) of raw facts: error stats, raw
timings, the witness file, or the cheat detected. It decides nothing about the score:
the parent harness recomputes every verdict and the score from these numbers, and
checks the witness against a reference run in a process without the candidate.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import secrets
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from evolve.benchmarks.kernels.process import exit_now

RESULT_TAG = "EVOLVE_KERNELS_RESULT "
_MONOTONIC = time.monotonic  # captured before the candidate is imported
MARKS: list[tuple[str, float]] = []  # (phase, monotonic time it began), reported to the harness


def mark(phase: str) -> None:
    """Phase ``phase`` of this evaluation begins now (the harness turns marks into ``time_<phase>``)."""
    MARKS.append((phase, _MONOTONIC()))


def _outputs_fail(stats: list[dict[str, Any]], tolerance: Any) -> str | None:
    from evolve.benchmarks.kernels.compare import verdict

    for index, s in enumerate(stats):
        reason = verdict(s, tolerance, name=f"output {index}")
        if reason:
            return reason
    return None


def run_workload(
    job: dict[str, Any], tools: dict[str, Any], candidate: Any, problem: Any, workload: Any
) -> dict[str, Any]:
    """All measurements of one workload; raises CheatDetected on a cheat."""
    import torch

    compare, guards, inputs, timing = (
        tools["compare"],
        tools["guards"],
        tools["inputs"],
        tools["timing"],
    )
    snapshot, blocker, reference = tools["snapshot"], tools["blocker"], tools["reference"]
    device = torch.device(job["device"])
    maker = inputs.InputMaker(problem, workload, device, reference)
    n_in = len(problem.definition.inputs)
    tol = workload.tolerance
    seed = int(job["seed"])
    result: dict[str, Any] = {
        "uuid": workload.uuid,
        "status": "ok",
        "rounds": [],
        "audits": [],
        "timings_ms": [],
        "timer": timing.resolve_timer(job.get("timer", "events"), device),
    }

    def reference_outputs(inputs_seed: int) -> list[torch.Tensor]:
        with torch.no_grad():
            return maker.normalize(reference.run(*maker.make(inputs_seed)))

    dps = bool(job.get("entry", {}).get("dps", True))

    def arguments(inputs_seed: int) -> list[Any]:
        """The call's arguments: inputs, then (destination-passing) fresh NaN-filled outputs."""
        made = maker.make(inputs_seed)
        return [*made, *maker.allocate()] if dps else made

    def outputs_of(args: list[Any], returned: Any, when: str) -> list[torch.Tensor]:
        if dps:
            return list(args[n_in:])
        guards.check_returned(returned, when)
        return maker.normalize(returned)

    def call_checked(args: list[Any], when: str) -> list[torch.Tensor]:
        facts = guards.TensorFacts(args[n_in:])
        with torch.no_grad():
            returned = candidate(*args)
        timing.synchronize(device)
        facts.check(when)
        snapshot.check(when)
        blocker.check(when)
        return outputs_of(args, returned, when)

    mark("correctness")
    threads = None
    recurring = tools[
        "pool"
    ].RecurringAddresses()  # every round's fresh values at the same addresses
    for r in range(int(job["rounds"])):
        round_seed = inputs.derive_seed(seed, workload.uuid, "round", r)
        ref = reference_outputs(round_seed)
        args = arguments(round_seed)
        args[:n_in] = recurring.place(args[:n_in])
        try:
            outs = call_checked(args, f"correctness round {r}")
        except guards.CheatDetected:
            raise
        except Exception as exc:  # the candidate crashed: an error, not a cheat
            result.update(
                status="error",
                message=f"round {r}: {type(exc).__name__}: {exc}",
                traceback=traceback.format_exc()[-3000:],
            )
            return result
        if threads is None:
            threads = (
                guards.thread_count()
            )  # after the first call: JIT compilers may start threads once
        stats = [compare.error_stats(o, ref_o, tol) for o, ref_o in zip(outs, ref, strict=True)]
        result["rounds"].append(stats)
        reason = _outputs_fail(stats, tol)
        if reason:
            result.update(status="incorrect", message=f"round {r}: {reason}")
            return result
        del args, ref, outs
    del recurring  # its buffers are not needed while timing

    mark("kernel_checks")
    first_kernels = guards.kernel_signature(
        candidate, arguments(inputs.derive_seed(seed, workload.uuid, "profile")), device
    )
    iters = int(job["iters"])
    witness_dir = Path(job["witness_dir"]) if job.get("witness_dir") else None
    warmup = int(job["warmup"])
    returned: dict[str, Any] = {}  # the last timed call's return value (non-DPS calls)
    for rep in range(int(job["repeats"])):
        chosen = sorted(secrets.SystemRandom().sample(range(iters), min(iters, int(job["audits"]))))
        witness_at = chosen[0] if (rep == 0 and chosen) else None
        # the other audited calls are probes in pairs: half the rows of their inputs changed, then
        # the other half (a cache keyed on a sample of the values is stale in one of the two)
        probes = [c for c in chosen if c != witness_at]
        generator = torch.Generator().manual_seed(secrets.randbits(62))
        probe_inputs: dict[int, list[Any]] = {}
        masks: list[Any] = []
        # The torch profiler and a CUPTI timing window cannot both subscribe to CUPTI: under the
        # CUPTI timer the kernel set is profiled before and after the loop only.
        cupti = timing.resolve_timer(job.get("timer", "events"), device) == "cupti"
        profile_at = chosen[-1] if chosen and not cupti else None

        facts_at: dict[int, Any] = {}
        shifted = None
        if job.get("inputs", "shifted") == "shifted":  # upstream: same values, new address per call
            base_seed = inputs.derive_seed(seed, workload.uuid, "timed", rep)
            shifted = tools["pool"].ShiftedInputs(maker.make(base_seed), warmup + iters)

        def inputs_seed_of(i: int, rep: int = rep, shifted: Any = shifted) -> int:
            if shifted is not None:
                return inputs.derive_seed(seed, workload.uuid, "timed", rep)
            return inputs.derive_seed(seed, workload.uuid, "timed", rep, i)

        def setup(i: int, chosen: Any = chosen, facts_at: Any = facts_at, shifted: Any = shifted, probes: Any = probes,
                  masks: Any = masks, generator: Any = generator, probe_inputs: Any = probe_inputs,
                  rep: int = rep) -> list[Any]:  # fmt: skip
            if shifted is not None:  # warm-up calls are i = -1, -2, ...: positions 0..warmup-1
                made = shifted.get(warmup + i if i >= 0 else -1 - i)
                args = [*made, *maker.allocate()] if dps else made
            else:
                args = arguments(inputs_seed_of(i))
            if i in probes:
                k = probes.index(i)
                fresh = maker.make(inputs.derive_seed(seed, workload.uuid, "probe", rep, i))
                if k % 2 == 0:
                    masks[:] = tools["pool"].row_masks(args[:n_in], generator)
                pair = masks if k % 2 == 0 else [None if m is None else ~m for m in masks]
                tools["pool"].perturb_rows(args[:n_in], fresh, pair)
                probe_inputs[i] = [
                    a.clone() if isinstance(a, torch.Tensor) else a for a in args[:n_in]
                ]
            if i in chosen:
                facts_at[i] = guards.TensorFacts(args[n_in:])
            return args

        def audit(i: int, args: Any, rep: int = rep, witness_at: Any = witness_at, profile_at: Any = profile_at,
                  facts_at: Any = facts_at, probe_inputs: Any = probe_inputs) -> None:  # fmt: skip
            facts_at.pop(i).check(f"timed call {i}")
            outs = [
                o.detach().clone()
                for o in outputs_of(args, returned.get("value"), f"timed call {i}")
            ]
            inputs_seed = inputs_seed_of(i)
            if i in probe_inputs:
                with torch.no_grad():
                    expected = maker.normalize(reference.run(*probe_inputs.pop(i)))
            else:
                expected = reference_outputs(inputs_seed)
            stats = [
                compare.error_stats(o, r_o, tol) for o, r_o in zip(outs, expected, strict=True)
            ]
            result["audits"].append(stats)
            reason = _outputs_fail(stats, tol)
            if reason:
                raise guards.CheatDetected(
                    f"timed call {i} gave wrong outputs ({reason}) although the correctness rounds passed"
                )
            if i == witness_at and witness_dir is not None:
                path = witness_dir / f"{workload.uuid}.pt"
                torch.save({"seed": inputs_seed, "outputs": [o.cpu() for o in outs]}, path)
                result["witness"] = {"seed": inputs_seed, "file": str(path)}
            if i == profile_at:
                extra = arguments(inputs.derive_seed(seed, workload.uuid, "profile", rep, i))
                guards.check_same_kernels(
                    first_kernels,
                    guards.kernel_signature(candidate, extra, device),
                    f"timed call {i}",
                )

        def timed(*args: Any) -> None:
            returned["value"] = candidate(*args)  # kept for the audit of a returning (non-DPS) call

        mark("timing")
        with torch.no_grad():
            result["timings_ms"].append(
                timing.measure(
                    timed,
                    setup,
                    device=device,
                    warmup=warmup,
                    iters=iters,
                    method=job.get("timer", "events"),
                    flush_l2=bool(job.get("flush_l2", True)),
                    audit_at=chosen,
                    audit=audit,
                )  # fmt: skip
            )
        result["timer"] = timing.last_timer()
        mark("kernel_checks")
        snapshot.check(f"timing repeat {rep}")
        blocker.check(f"timing repeat {rep}")
        if threads is not None:
            guards.check_threads(threads, f"timing repeat {rep}")
    last = guards.kernel_signature(
        candidate, arguments(inputs.derive_seed(seed, workload.uuid, "profile", "last")), device
    )
    if any(k.startswith("(profiler unavailable") for k in last) and result["timer"].startswith(
        "cupti"
    ):
        result["kernels_check"] = (
            "after timing: skipped, the torch profiler did not start again after CUPTI timing"
        )
    else:
        guards.check_same_kernels(first_kernels, last, "after timing")
    result["kernels"] = first_kernels
    return result


def _settle_lazy_imports(device: str) -> None:
    """Import, before the snapshot, what rebinds torch functions when first imported.

    The torch profiler (used on GPUs) imports torch._dynamo, which wraps torch.manual_seed;
    Triton (when installed) is imported for any candidate that may use it.
    """
    if device.startswith("cuda"):
        import torch._dynamo  # noqa: F401
        import torch.profiler  # noqa: F401
    with contextlib.suppress(ImportError):
        import triton  # noqa: F401
        import triton.language  # noqa: F401


def _load_entry(entry: dict[str, Any]) -> Any:
    """The candidate's function: from its Python file, or from the extension the harness built."""
    if (
        "so" in entry
    ):  # a C++ solution: the harness compiled it; the path is the harness's, not the candidate's
        spec = importlib.util.spec_from_file_location(entry["module"], entry["so"])
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        sys.path.insert(0, str(Path.cwd()))
        name = entry["file"].removesuffix(".py").replace("/", ".")
        module = importlib.import_module(name)
    return getattr(module, entry["function"], None)


def main() -> int:
    """Entry point: import, read the job, prepare, import the candidate, measure, print one result line."""
    real_stdout = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever the candidate prints goes to stderr, never into the result stream
    sys.stdout = os.fdopen(1, "w", closefd=False)

    def emit(payload: dict[str, Any]) -> None:
        mark("process_exit")
        payload = {**payload, "marks": MARKS}
        real_stdout.write(RESULT_TAG + json.dumps(payload) + "\n")
        real_stdout.flush()

    try:  # before the job: a driver the harness started ahead of its evaluation does this early
        import torch
        from evolve.benchmarks.kernels import (
            compare,
            guards,
            heuristics,
            inputs,
            pool,
            spec,
            timing,
        )

        _settle_lazy_imports(sys.argv[1])
    except Exception as exc:
        emit({"fatal": f"harness setup failed: {type(exc).__name__}: {exc}",
              "traceback": traceback.format_exc()[-3000:]})  # fmt: skip
        return 0
    text = sys.stdin.read()
    if not text:  # the harness ended without handing this driver a job
        return 0
    job = json.loads(text)
    os.environ.update(job.get("env", {}))  # the evaluation's seed, for the candidate
    try:
        problem = spec.load_problem(job["problem_dir"])
        harness_dir = Path(job["harness_dir"])
        reference = inputs.load_reference(problem.definition, harness_dir)
        entry = job.get("entry") or {"file": "kernel.py", "function": "run", "dps": True}
        if job["device"].startswith("cuda") and not torch.cuda.is_available():
            emit({"fatal": "the job asks for a CUDA device but torch sees none in the sandbox"})
            return 0
        # every name of the harness's modules the driver goes through, this one included
        snapshot = guards.Snapshot(
            extra=guards.module_targets(
                sys.modules[__name__], compare, guards, heuristics, inputs, pool, timing
            )
        )
        blocker = guards.CppBlocker()
    except Exception as exc:
        emit(
            {
                "fatal": f"harness setup failed: {type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-3000:],
            }
        )
        return 0

    tools = {"compare": compare, "guards": guards, "inputs": inputs, "timing": timing, "pool": pool,
             "snapshot": snapshot, "blocker": blocker, "reference": reference}  # fmt: skip
    mark("candidate_import")
    try:
        candidate = _load_entry(entry)
        if not callable(candidate):
            emit({"error": f"{entry['file']} defines no callable {entry['function']}()"})
            return 0
        snapshot.check("after import")
        blocker.check("after import")
    except guards.CheatDetected as exc:
        emit({"cheat": str(exc)})
        return 0
    except Exception as exc:
        emit(
            {
                "error": f"importing the candidate failed: {type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-3000:],
            }
        )
        return 0

    results = []
    wanted = job.get("workloads")
    for workload in problem.workloads:
        if wanted and workload.uuid not in wanted:
            continue
        try:
            results.append(run_workload(job, tools, candidate, problem, workload))
        except guards.CheatDetected as exc:
            emit({"cheat": str(exc), "workloads": results})
            return 0
        except Exception as exc:
            if isinstance(exc, torch.cuda.OutOfMemoryError):
                torch.cuda.empty_cache()
            results.append({"uuid": workload.uuid, "status": "error", "message": f"{type(exc).__name__}: {exc}",
                            "traceback": traceback.format_exc()[-3000:]})  # fmt: skip
        with contextlib.suppress(Exception):
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    emit({"workloads": results})
    return 0


if __name__ == "__main__":
    exit_now(main())
