"""GPU measurements against upstream's own files, for RESULTS.md (called by ``gpu_run``).

- ``score_examples``: each upstream example problem scored with its own shipped solution
  (``solution_*.json``) through the full harness, C++ ones built by the harness first (in
  parallel, before any GPU work); a table of language, status, local and published score.
- ``compare_timers``: the reference of every example workload timed with CUDA events and
  with CUPTI on the same inputs; the rows under 10 us are the ones where the timer matters.
- ``run_suite_evolve``: an evolve run of ``kernels_suite`` over several problems with the
  built-in operators; the seed's aggregate score and the best one.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from statistics import median
from typing import Any

from evolve.harness.reaper import kill_group

from .build import BuildError, build
from .harness import Harness, Settings, referee_call
from .solution import load_solution, stage
from .spec import load_problem


def example_dirs(root: Path) -> list[Path]:
    """Problem folders under ``root`` that ship a solution (``definition.json`` + ``solution*.json``)."""
    return sorted(
        p.parent for p in root.rglob("definition.json") if list(p.parent.glob("solution*.json"))
    )


def score_examples(root: Path, settings: Settings, calibration: dict, env: dict[str, str], log: Callable[[str], None],
                   workloads: int = 3) -> list[dict[str, Any]]:  # fmt: skip
    """Score every example with its own solution; one row per example."""
    folders = example_dirs(root)
    solutions = {f: load_solution(f) for f in folders}
    with ThreadPoolExecutor(max_workers=4) as pool:  # compile C++ while nothing else runs
        futures = {f: pool.submit(build, s, timeout_s=settings.build_timeout_s, env=env)
                   for f, s in solutions.items() if s.compiled}  # fmt: skip
        builds = {}
        for folder, future in futures.items():
            try:
                builds[folder] = f"built in {future.result().seconds:.0f} s"
            except BuildError as exc:
                builds[folder] = f"build failed: {str(exc)[:300]}"
            log(f"{folder.name}: {builds[folder]}")
    rows = []
    for folder, solution in solutions.items():
        problem = load_problem(folder)
        chosen = tuple(w.uuid for w in problem.workloads[:workloads])
        row: dict[str, Any] = {"problem": problem.name, "folder": str(folder.relative_to(root)),
                               "language": "+".join(solution.languages), "solution": solution.name,
                               "dps": solution.destination_passing, "build": builds.get(folder, "-")}  # fmt: skip
        started = time.monotonic()
        try:
            harness = Harness(problem, replace(settings, workloads=chosen), calibration=calibration)
            with tempfile.TemporaryDirectory(prefix="evolve-kernels-example-") as tmp:
                stage(solution, Path(tmp))
                (Path(tmp) / "definition.json").write_text((folder / "definition.json").read_text())
                (Path(tmp) / "reference.py").write_text(problem.definition.reference)
                report = harness.evaluate(Path(tmp), env=env)
            row.update(status=report.status, score_local=report.score if report.status == "ok" else 0.0,
                       score_published=report.published_score, published_hardware=report.published_hardware,
                       timer=report.timer, message=report.message[:300],
                       rows=[{"uuid": r.uuid, "status": r.status, "kernel_ms": r.kernel_ms, "baseline_ms": r.baseline_ms,
                              "sol_ms": r.sol_ms, "score": r.score, "flops_method": r.flops_method} for r in report.rows])  # fmt: skip
        except Exception as exc:  # one example failing must not lose the others
            row.update(
                status="error",
                score_local=0.0,
                score_published=None,
                message=f"{type(exc).__name__}: {exc}"[:300],
            )
        row["seconds"] = time.monotonic() - started
        log(
            f"{row['folder']}: {row['language']} {row['status']} local {row['score_local']:.3f} {row.get('message', '')[:120]}"
        )
        rows.append(row)
    return rows


def compare_timers(roots: list[Path], settings: Settings, env: dict[str, str],
                   workloads: int | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Events vs CUPTI medians of the reference on the workloads of every problem under ``roots``."""
    folders = sorted({p.parent for root in roots for p in root.rglob("definition.json")})
    job = {"task": "timers", "problems": [str(f) for f in folders], "warmup": 10, "iters": 50,
           "workloads": workloads}  # fmt: skip
    return referee_call(job, settings, env)["timers"]


def run_suite_evolve(problems: list[str], candidates: int, minutes: float, out: Path, calibration: Path,
                     env: dict[str, str], log: Callable[[str], None]) -> dict[str, Any]:  # fmt: skip
    """``python -m evolve benchmark=kernels_suite`` with the built-in operators; seed and best aggregate."""
    run_dir = out / "evolve_suite"
    command = [sys.executable, "-m", "evolve", "benchmark=kernels_suite", f"benchmark.problems=[{','.join(problems)}]",
               f"search.max_candidates={candidates}", f"search.max_wall_s={int(minutes * 60)}", "search.progress=false",
               f"benchmark.fitness.calibration={calibration}", "benchmark.fitness.baseline=eager",
               "+benchmark.fitness.rounds=3", "+benchmark.fitness.warmup=5", "+benchmark.fitness.iters=20",
               "+benchmark.fitness.workloads_per_problem=1",
               f"hydra.run.dir={run_dir}"]  # fmt: skip
    log(f"suite evolve: {' '.join(command)}")
    started = time.monotonic()
    returncode, output = run_bounded(command, env, minutes * 60 + 300)
    (out / "evolve_suite_log.txt").write_text(str(output))
    result: dict[str, Any] = {"command": " ".join(command), "returncode": returncode, "problems": problems,
                              "seconds": time.monotonic() - started}  # fmt: skip
    result.update(archive_summary(run_dir / "archive.db"))
    log(f"suite evolve: { {k: v for k, v in result.items() if 'metrics' not in k} }")
    return result


def archive_summary(db: Path) -> dict[str, Any]:
    """Seed and best of a finished run's archive: counts, scores, the best's operator and change."""
    if not db.is_file():
        return {}
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT e.status, e.fitness, e.metrics, c.operator, c.description FROM evaluations e "
                            "JOIN candidates c ON c.id = e.candidate ORDER BY e.id").fetchall()  # fmt: skip
    ok = [r for r in rows if r[0] == "ok" and r[1] is not None]
    seed, best = (ok[0], max(ok, key=lambda r: r[1])) if ok else (None, None)
    return {
        "evaluated": len(rows),
        "ok": len(ok),
        "seed_score": seed[1] if seed else None,
        "best_score": best[1] if best else None,
        "best_operator": best[3] if best else None,
        "best_description": best[4] if best else None,
        "seed_metrics": _metrics(seed[2]) if seed else {},
        "best_metrics": _metrics(best[2]) if best else {},
    }


def run_bounded(
    command: list[str], env: dict[str, str], timeout_s: float
) -> tuple[int | None, str]:
    """Run a command in its own session; at the timeout its whole process group is killed
    (the harness layer's ``kill_group``), evaluation workers included. (returncode or None, output)."""
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, output
    except subprocess.TimeoutExpired:
        kill_group(proc)
        output, _ = proc.communicate()
        return None, f"timed out after {timeout_s:.0f} s (process group killed)\n{output or ''}"


def _metrics(text: Any) -> dict[str, Any]:
    try:
        return {k: v for k, v in json.loads(text).items() if k.endswith("/score")}
    except (TypeError, ValueError):
        return {}


def timer_table(timers: list[dict]) -> str:
    """Events vs CUPTI, shortest first (under 10 us is where the timer matters), in microseconds."""
    out = ["| problem | workload (axes) | events us | CUPTI us | events - CUPTI us | activities/call | timers |",
           "| --- | --- | ---: | ---: | ---: | ---: | --- |"]  # fmt: skip
    for t in sorted(timers, key=lambda t: t.get("events_ms", float("inf"))):
        axes = " ".join(f"{k}={v}" for k, v in (t.get("axes") or {}).items()) or t["uuid"][:12]
        events = (
            f"{t['events_ms'] * 1e3:.2f}"
            if "events_ms" in t
            else f"failed: {t.get('events_error', '')[:80]}"
        )
        if "cupti_ms" in t and "events_ms" in t:
            cupti, diff = (
                f"{t['cupti_ms'] * 1e3:.2f}",
                f"{(t['events_ms'] - t['cupti_ms']) * 1e3:+.2f}",
            )
        else:
            cupti, diff = f"failed: {t.get('cupti_error', '-')[:80]}", ""
        used = f"{t.get('events_timer', '-')} / {t.get('cupti_timer', '-')}"[:80]
        out.append(f"| {t['problem'][:40]} | {axes[:60]} | {events} | {cupti} | {diff} | "
                   f"{t.get('cupti_activities') or '-'} | {used} |")  # fmt: skip
    pairs = [t for t in timers if "events_ms" in t and "cupti_ms" in t]
    short = [t for t in pairs if t["events_ms"] < 0.010]
    if short:
        diffs = sorted((t["events_ms"] - t["cupti_ms"]) * 1e3 for t in short)
        out += ["", f"{len(short)} of {len(pairs)} workloads under 10 us by events; events - CUPTI there: "
                    f"median {median(diffs):+.2f} us, range {diffs[0]:+.2f} to {diffs[-1]:+.2f} us."]  # fmt: skip
    return "\n".join(out)


def markdown(examples: list[dict], timers: list[dict], suite: dict | None) -> str:
    """RESULTS.md sections for the upstream examples, the timer comparison and the suite run."""
    out = ["| example | language | status | score (local) | score (published) | timer | note |",
           "| --- | --- | --- | ---: | ---: | --- | --- |"]  # fmt: skip
    for r in examples:
        pub = "-" if r.get("score_published") is None else f"{r['score_published']:.3f}"
        note = f"{r.get('build', '-')}; {r.get('message', '')}".replace("|", "/").replace(
            "\n", " "
        )[:160]
        out.append(
            f"| {r['folder']} | {r['language']} | {r['status']} | {r['score_local']:.3f} | {pub} | {r.get('timer', '-')} | {note} |"
        )
    out += ["", timer_table(timers)]
    if suite:
        out += ["", f"Suite evolve over {len(suite['problems'])} problems (`{suite['command']}`): {suite.get('evaluated', 0)} "
                    f"evaluated ({suite.get('ok', 0)} ok) in {suite['seconds']:.0f} s; aggregate seed "
                    f"{suite.get('seed_score') or 0:.4f} -> best {suite.get('best_score') or 0:.4f} ({suite.get('best_operator') or '-'})."]  # fmt: skip
    return "\n".join(out) + "\n"
