"""The parent side of a kernel evaluation: runs the sandboxed processes and computes the score.

For one problem and one candidate folder it (1) gets the machine's ceilings and the
problem's baselines from the referee process (measured once per process and kept),
(2) runs the timer in the sandbox (``timer.py``: it owns the inputs' seed, the clock and
every comparison, and hosts the candidate in a child process that cannot reach it), then
(3) recomputes every verdict from the timer's raw error stats with the workload's
tolerance and every time from its raw timings, and scores. Nothing the candidate's
process says is taken as a measurement, a verdict or a score.
"""

from __future__ import annotations

import math
import secrets
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .build import BuildError, build
from .compare import verdict
from .process import (
    PER_EVALUATION_ENV,
    REFEREE,
    TIMER,
    harness_json,
    prepare_next_timer,
    prepare_referee,
    special_files,
    take_timer,
)
from .report import Report, WorkloadRow
from .roofline import sol_ms
from .score import (
    above_sol,
    coefficient_of_variation,
    problem_score,
    sol_score,
)
from .solution import LANGUAGE_MODULES, LANGUAGE_PACKAGES, read_candidate
from .spec import Problem, SpecError

__all__ = ["Harness", "Report", "Settings", "WorkloadRow", "referee_call"]
_CACHE: dict[str, Any] = {}  # per process: calibration and baselines, measured once


@dataclass(frozen=True, kw_only=True)
class Settings:
    """How a candidate is measured (defaults: BENCHMARKS.md section 3)."""

    device: str = "cuda"
    rounds: int = 10
    warmup: int = 10
    iters: int = 50
    repeats: int = 1
    audits: int = 3  # probes among the timed calls (in pairs: half the rows changed, then the other half)
    batch: int = 10  # timed calls per batch: one round trip to the candidate's process, one timing
    baseline: str = "compile"  # or "eager": T_b = the reference without torch.compile
    flush_l2: bool = True
    timeout_s: float = 900.0
    referee_timeout_s: float = 1800.0
    quick_calibration: bool = False
    workloads: tuple[str, ...] = ()
    inputs: str = (
        "shifted"  # timed calls: upstream's same values at shifted addresses, or "fresh" per call
    )
    timer: str = (
        "cupti"  # upstream's default; CUDA events where cupti-python is missing (the report says)
    )
    build_timeout_s: float = 600.0
    build_cache: str | None = None  # default build.default_cache()

    def strict(self) -> Settings:
        """The auditor's stricter mode: three times the correctness rounds and probes, at least a
        pair of probes (see ``timer``)."""
        return replace(self, rounds=3 * self.rounds, audits=max(2, 3 * self.audits))


def _importable(module: str | None) -> bool:
    if module is None:
        return True
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def referee_call(job: Mapping[str, Any], settings: Settings, env: Mapping[str, str]) -> dict[str, Any]:
    """Run one referee task in the sandbox (its own temp folder) and return its payload."""
    # harness code only: safe to retry once if killed from outside (OOM killer)
    for _attempt in range(2):
        with prepare_referee(settings.device, settings.referee_timeout_s, env) as referee:
            task = {"device": settings.device, "harness_dir": str(referee.folder), **job}
            payload, result = harness_json(REFEREE, task, cwd=referee.folder, timeout_s=settings.referee_timeout_s,
                                           env=env, gpu=settings.device.startswith("cuda"), started=referee.started)  # fmt: skip
        if payload is not None or result.timed_out or (result.returncode or 0) >= 0:
            break
    if payload is None or "fatal" in payload:
        detail = (payload or {}).get("fatal") or (
            "timed out" if result.timed_out else f"exit {result.returncode}"
        )
        trace = (payload or {}).get("traceback", "")
        raise RuntimeError(
            f"kernels referee ({job['task']}) failed: {detail}\n{trace}{result.tail(3000)}"
        )
    return payload


class Harness:
    """Measures candidates on one problem; keeps calibration and baselines for the process's life."""

    def __init__(
        self,
        problem: Problem,
        settings: Settings,
        *,
        calibration: Mapping[str, Any] | None = None,
        baselines: Mapping[str, Any] | None = None,
    ):
        self.problem = problem
        self.settings = settings
        self.fixed_calibration = dict(calibration) if calibration else None
        self.fixed_baselines = dict(baselines) if baselines else None

    def _selected(self) -> list[str]:
        return [
            w.uuid
            for w in self.problem.workloads
            if not self.settings.workloads or w.uuid in self.settings.workloads
        ]

    def _referee(self, job: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
        job = {"problem_dir": str(self.problem.root), **job}
        return referee_call(job, self.settings, env)

    def timer_job(self, s: Settings, entry: dict[str, Any], env: Mapping[str, str], *,
                  harness_dir: Path) -> dict[str, Any]:  # fmt: skip
        """The timer's job for one evaluation with settings ``s`` (its input seed drawn now)."""
        return {"problem_dir": str(self.problem.root), "harness_dir": str(harness_dir), "device": s.device,
                "seed": secrets.randbits(62), "rounds": s.rounds, "warmup": s.warmup, "iters": s.iters,
                "repeats": s.repeats, "audits": s.audits, "batch": s.batch, "flush_l2": s.flush_l2,
                "workloads": self._selected(), "entry": entry, "inputs": s.inputs,
                "env": {k: env[k] for k in PER_EVALUATION_ENV if k in env}}  # fmt: skip

    def calibration(self, env: Mapping[str, str]) -> dict[str, Any]:
        """The machine's ceilings: the given calibration, else measured once in this process."""
        if self.fixed_calibration:
            return self.fixed_calibration
        key = f"calibration|{self.settings.device}|{env.get('CUDA_VISIBLE_DEVICES')}|{self.settings.quick_calibration}"
        if key not in _CACHE:
            _CACHE[key] = self._referee(
                {"task": "calibrate", "quick": self.settings.quick_calibration}, env
            )["calibration"]
        return _CACHE[key]

    def baselines(self, env: Mapping[str, str]) -> dict[str, Any]:
        """Reference and baseline timings, bytes and FLOPs per workload, measured once in this process."""
        if self.fixed_baselines:
            return self.fixed_baselines
        s = self.settings
        key = f"baseline|{self.problem.root}|{self.problem.name}|{s.device}|{env.get('CUDA_VISIBLE_DEVICES')}|{s.baseline}|{s.warmup}|{s.iters}|{s.repeats}|{s.inputs}|{s.batch}|{self._selected()}"
        if key not in _CACHE:
            job = {"task": "baseline", "workloads": self._selected(), "warmup": s.warmup, "iters": s.iters,
                   "baseline": s.baseline, "seed": 0, "repeats": s.repeats, "inputs": s.inputs, "batch": s.batch,
                   "flush_l2": s.flush_l2}  # fmt: skip
            _CACHE[key] = self._referee(job, env)["workloads"]
        return _CACHE[key]

    def entry(self, workdir: Path, report: Report, env: Mapping[str, str]) -> dict[str, Any] | None:
        """What the candidate's process calls: kernel.py's run, a solution's Python entry, or the extension
        the harness builds from a C++ solution (None, with the report filled in, when that fails)."""
        try:
            solution = read_candidate(workdir)
        except SpecError as exc:
            report.status, report.message = "error", str(exc)
            return None
        if solution is None:
            return {"file": "kernel.py", "function": "run", "dps": True}
        report.language = "+".join(solution.languages)
        entry = {
            "file": solution.entry_file,
            "function": solution.entry_function,
            "dps": solution.destination_passing,
        }
        if not solution.compiled:
            missing = [
                lang for lang in solution.languages if not _importable(LANGUAGE_MODULES.get(lang))
            ]
            if missing:
                report.status = "error"
                report.message = (f"{missing[0]} needs the Python package providing {LANGUAGE_MODULES[missing[0]]!r}, "
                                  f"which this machine lacks (pip install {LANGUAGE_PACKAGES[missing[0]]})")  # fmt: skip
                return None
            return entry
        try:
            built = build(solution, cache=Path(self.settings.build_cache) if self.settings.build_cache else None,
                          timeout_s=self.settings.build_timeout_s, env=dict(env))  # fmt: skip
        except BuildError as exc:
            report.status, report.message = "error", f"build failed: {exc}"
            return None
        report.build = {"key": built.key, "cached": built.cached, "seconds": built.seconds}
        return {**entry, "so": built.path, "module": built.module}

    def evaluate(self, workdir: Path, *, env: Mapping[str, str], strict: bool = False) -> Report:
        """Measure the candidate in ``workdir`` (kernel.py or a solution.json) and score it.

        The inputs come from a seed drawn here per evaluation, which the candidate cannot know
        (its own seed reaches it through ``env``). ``strict``: ``Settings.strict``.
        """
        report = Report(problem=self.problem.name)
        report.mark("calibration")  # measured once per process: about 0 s after the first
        calibration = self.calibration(env)
        report.mark("baseline")  # the same, per problem and GPU
        baselines = self.baselines(env)
        report.mark("build")
        entry = self.entry(workdir, report, env)
        if entry is None:
            return report
        device, timeout_s = self.settings.device, self.settings.timeout_s
        # the next evaluations' timers (each with its candidate's process) start now and import
        # while this candidate runs (only the CPU: neither touches the GPU before its job)
        with take_timer(device, timeout_s, env) as timer:
            prepare_next_timer(device, timeout_s, env)
            # the candidate's files go into the timer's folder (links stay links), after both
            # processes imported the harness's modules, so no file of theirs can stand in for one
            shutil.copytree(workdir, timer.folder / "work", symlinks=True, dirs_exist_ok=True,
                            ignore=special_files)  # fmt: skip
            s = self.settings.strict() if strict else self.settings
            job = self.timer_job(s, entry, env, harness_dir=timer.folder / "harness")
            launched = time.monotonic()
            report.mark("process_start")  # until the timer is ready to load the candidate
            raw, result = harness_json(TIMER, job, cwd=timer.folder / "work", timeout_s=timeout_s, env=env,
                                       gpu=device.startswith("cuda"), started=timer.started)  # fmt: skip
            returned = time.monotonic()
            timer_marks = (raw or {}).get("marks") or [("candidate_process", launched)]
            for name, at in timer_marks:  # the timer's clock is this machine's monotonic clock
                report.mark(str(name), min(max(float(at), launched), returned))
            report.output = result.tail(4000)
            if result.leftover:  # (no verdict is read then: work left behind could outlive it)
                report.status, report.message = "cheat", f"candidate left {result.leftover} process(es) running"
                return report
            if raw is None:
                why = "timed out" if result.timed_out else f"exited with status {result.returncode} without a result"
                report.status = "timeout" if result.timed_out else "error"
                report.message = f"the timer and the candidate's process {why}"
                return report
            for key, status in (("fatal", "error"), ("error", "error"), ("cheat", "cheat")):
                if key in raw:
                    report.status, report.message = status, raw[key]
                    if raw.get("traceback"):
                        report.message += "\n" + raw["traceback"][-1500:]
                    return report
            report.mark("scoring")
            self._score(report, raw, baselines, calibration, s)
            return report

    def _score(self, report: Report, raw: dict[str, Any], baselines: dict[str, Any], calibration: dict[str, Any],
               settings: Settings) -> None:  # fmt: skip
        by_uuid = {w["uuid"]: w for w in raw.get("workloads", [])}
        report.ceilings = {
            k: calibration[k] for k in ("bandwidth_bytes_per_s", "matrix_flops_per_s")
        }
        for uuid in self._selected():
            workload = self.problem.workload(uuid)
            row = WorkloadRow(uuid=uuid)
            report.rows.append(row)
            base = baselines.get(uuid) or {"error": "not measured"}
            if "error" in base:  # the harness could not run the reference here (e.g. out of memory)
                row.status, row.message = (
                    "error",
                    f"reference/baseline failed on this workload: {base['error']}",
                )
                continue
            row.reference_ms = _median([_median(t) for t in base["reference_ms"]])
            row.baseline_ms = (
                _median([_median(t) for t in base["baseline_ms"]])
                if base.get("baseline_ms")
                else row.reference_ms
            )
            row.flops_method = base.get("flops_method", "")
            row.bytes, row.flops = base["bytes"], dict(base.get("flops", {}))
            sol = sol_ms(base["bytes"], base.get("flops", {}), calibration)
            row.sol_ms, row.memory_ms, row.compute_ms = (
                sol["sol_ms"],
                sol["memory_ms"],
                sol["compute_ms"],
            )
            got = by_uuid.get(uuid)
            if got is None:
                row.status, row.message = "error", "no result for this workload"
                continue
            row.status, row.message = got["status"], got.get("message", "")
            if got.get("traceback"):  # the candidate's own error, for the feedback to operators
                row.message += "\n" + got["traceback"][-1500:]
            if row.status != "ok":
                continue
            problems = self._verify(got, workload, settings)
            if problems:
                row.status, row.message = "incorrect", problems
                continue
            row.repeat_medians = [_median(t) for t in got["timings_ms"]]
            row.kernel_ms = _median(row.repeat_medians)
            report.timer = got.get("timer", "")
            row.cv = coefficient_of_variation(row.repeat_medians)
            row.score = sol_score(row.kernel_ms, row.baseline_ms, row.sol_ms)
            published = self.problem.published.get(uuid)
            if published:
                row.published_baseline_ms, row.published_sol_ms = (
                    published["baseline_ms"],
                    published["sol_ms"],
                )
                row.published_score = sol_score(
                    row.kernel_ms, row.published_baseline_ms, row.published_sol_ms
                )
            row.flagged = above_sol(row.score)
            report.kernels = got.get("kernels", {})
        failed = [r for r in report.rows if r.status != "ok"]
        report.score = problem_score([r.score if r.status == "ok" else None for r in report.rows])
        if report.rows and all(uuid in self.problem.published for uuid in self._selected()):
            report.published_hardware = self.problem.published_hardware
            report.published_score = problem_score(
                [r.published_score if r.status == "ok" else None for r in report.rows]
            )
        if any(r.status == "cheat" for r in failed):
            report.status, report.message = (
                "cheat",
                "; ".join(f"{r.uuid}: {r.message}" for r in failed if r.status == "cheat"),
            )
        elif failed:
            report.status = "error" if all(r.status == "error" for r in failed) else "invalid"
            report.message = "; ".join(f"{r.uuid}: {r.status}: {r.message}" for r in failed)[:2000]
        flagged = [r.uuid for r in report.rows if r.flagged]
        if flagged and not report.message:
            report.message = f"score above 1 on {flagged}: faster than the roofline, so the SOL bound or the timing is wrong"

    def _verify(self, got: dict[str, Any], workload: Any, settings: Settings) -> str:
        """Recompute every verdict from raw stats and check the timings; '' when all is well."""
        tol = workload.tolerance
        if len(got.get("rounds", [])) != settings.rounds:
            return f"{len(got.get('rounds', []))} correctness rounds reported, {settings.rounds} required"
        for r, stats in enumerate(got["rounds"]):
            for i, s in enumerate(stats):
                reason = verdict(s, tol, name=f"round {r} output {i}")
                if reason:
                    return reason
        timings = got.get("timings_ms", [])
        batches = math.ceil(settings.iters / max(1, settings.batch))
        if len(timings) != settings.repeats or any(len(t) != batches for t in timings):
            return "the timing loop did not report the expected number of timed batches"
        if any(not (isinstance(v, int | float) and math.isfinite(v) and v > 0) for t in timings for v in t):
            return "a reported time is not a positive finite number"
        return ""
