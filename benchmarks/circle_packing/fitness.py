"""The circle-packing harness: runs the candidate, then verifies its packing and scores it itself.

The candidate only writes centres and radii to ``packing.json``. The harness checks, with
zero tolerance, that there are exactly ``n_circles`` finite circles of positive radius,
each inside the unit square and no two overlapping, and scores the sum of radii. A valid
packing's tight constraints (``shape.py``) are fed back as the artifact ``constraints``.

The candidate's budget is CPU time, not wall time, so that a program searching until a
deadline scores the same on a loaded machine and cannot buy more search by running in
parallel: ``cpu_budget_s`` CPU seconds over all its processes and threads together (told to
it as ``EVOLVE_CPU_BUDGET_S``; each process is also held to it by RLIMIT_CPU), measured by
the harness from the resource usage of the process tree it waited for, orphans included
(``evolve.harness.orphans``). The wall-clock timeout (the benchmark's ``timeout_s``, stated
in TASK.md) is only a backstop; the error of a timeout names which limit was hit, and the
artifact ``limit`` says it in one word (``cpu``: the program's fault; ``wall``: its CPU budget
was not reached, so the auditor retries a strict re-evaluation that ends there).
"""

from __future__ import annotations

import itertools
import json
import math
import resource
import shutil
import sys
from fractions import Fraction
from pathlib import Path

from evolve.harness import orphans, phases
from evolve.harness.fitness import EvalContext, Limits, read_output, run_sandboxed, sandbox_failure
from evolve.types import Descriptor, Direction, EvalStatus, Evaluation, Objective

from .shape import contacts, features

OUTPUT = "packing.json"


def check_packing(centers: list, radii: list, n_circles: int) -> str | None:
    """Why the packing is invalid, or None when it is valid.

    Exact arithmetic on the numbers given (as fractions): computed in floats, ``x + r`` or a
    squared distance rounds, and a circle a few units in the last place past a limit passes.
    """
    if len(centers) != n_circles or len(radii) != n_circles:
        return f"expected {n_circles} circles, got {len(centers)} centres and {len(radii)} radii"
    exact = []
    for i, (center, r) in enumerate(zip(centers, radii, strict=True)):
        if not isinstance(center, list) or len(center) != 2:
            return f"circle {i}: centre {str(center)[:80]} is not a pair [x, y]"
        x, y = center
        if not all(
            isinstance(v, int) or (isinstance(v, float) and math.isfinite(v)) for v in (x, y, r)
        ):
            return f"circle {i}: non-finite or non-numeric value"
        if r <= 0:
            return f"circle {i}: radius {r} is not positive"
        fx, fy, fr = Fraction(x), Fraction(y), Fraction(r)
        if fx - fr < 0 or fx + fr > 1 or fy - fr < 0 or fy + fr > 1:
            return f"circle {i} at ({x}, {y}) with radius {r} leaves the unit square"
        exact.append((fx, fy, fr))
    for (i, (xa, ya, ra)), (j, (xb, yb, rb)) in itertools.combinations(enumerate(exact), 2):
        if (xa - xb) ** 2 + (ya - yb) ** 2 < (ra + rb) ** 2:
            return f"circles {i} and {j} overlap"
    return None


class CirclePacking:
    """Maximise the sum of radii of ``n_circles`` disjoint circles in the unit square.

    Descriptors (``shape.features`` computes more; these were chosen by their measured spread,
    ``scripts/diversity.py``): ``offset``, how far the radius-weighted centre of the packing
    lies from the square's centre, and ``radius_range``, the largest radius minus the
    smallest. Among the best quarter of 100-candidate runs they still spread over 4 and 2-3
    bins, where the radii's standard deviation stayed inside one bin.
    """

    objective = Objective(name="sum_radii", direction=Direction.MAXIMIZE)
    descriptors = (
        Descriptor(name="offset", low=0.0, high=0.04, bins=10),
        Descriptor(name="radius_range", low=0.0, high=0.16, bins=8),
    )

    def __init__(self, *, n_circles: int = 26, cpu_budget_s: float = 20.0) -> None:
        self.n_circles, self.cpu_budget_s = n_circles, cpu_budget_s

    def evaluate(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        output = workdir / OUTPUT
        if output.is_dir() and not output.is_symlink():  # shipped as a folder of files
            shutil.rmtree(output)
        else:  # a packing shipped with the candidate goes before it runs
            output.unlink(missing_ok=True)
        code_chars = len(
            (workdir / "packing.py").read_text(errors="replace")
        )  # read before it runs
        before = _children_cpu_s()
        phases.mark("sandbox_start")
        # a process the candidate orphans is adopted and reaped here: its CPU time counts
        with orphans.adopted():
            result = run_sandboxed(
                [sys.executable, "packing.py", str(self.n_circles)],
                cwd=workdir,
                limits=Limits(
                    timeout_s=ctx.timeout_s,
                    memory_bytes=4 << 30,
                    cpu_s=math.ceil(self.cpu_budget_s) + 1,
                ),
                env={**ctx.env(), "EVOLVE_CPU_BUDGET_S": f"{self.cpu_budget_s:g}"},
            )
        phases.mark("program", at=result.started_at)
        phases.mark("sandbox_exit", at=result.exited_at)
        phases.mark("verify")
        cpu_s = _children_cpu_s() - before
        if cpu_s > self.cpu_budget_s:
            return Evaluation(
                status=EvalStatus.TIMEOUT,
                metrics={"cpu_s": cpu_s},
                artifacts={
                    "error": f"CPU budget {self.cpu_budget_s:g} s exceeded: the program used "
                    f"{cpu_s:.1f} CPU seconds (all its processes and threads together); search "
                    "within EVOLVE_CPU_BUDGET_S, e.g. by time.process_time() in one process",
                    "limit": "cpu",
                    "output": result.tail(),
                },
            )
        if result.timed_out and not result.modified:
            return Evaluation(
                status=EvalStatus.TIMEOUT,
                metrics={"cpu_s": cpu_s, "run_s": result.wall_s},
                artifacts={
                    "error": f"wall limit {ctx.timeout_s:g} s reached after {cpu_s:.1f} of the "
                    f"{self.cpu_budget_s:g} CPU seconds: the CPU budget was not reached, so the "
                    "machine was loaded or the program waited (sleep, I/O)",
                    "limit": "wall",
                    "output": result.tail(),
                },
            )
        failure = sandbox_failure(result)
        if failure is not None:
            return failure
        try:
            data = json.loads(read_output(output, limit_bytes=1 << 20))
            centers, radii = data["centers"], data["radii"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return Evaluation(
                status=EvalStatus.INVALID,
                artifacts={
                    "error": f"no readable {OUTPUT} with 'centers' and 'radii' ({exc})",
                    "output": result.tail(),
                },
            )
        problem = check_packing(centers, radii, self.n_circles)
        if problem is not None:
            return Evaluation(
                status=EvalStatus.INVALID, artifacts={"error": problem, "output": result.tail()}
            )
        phases.mark("score")
        total = math.fsum(radii)
        tight = contacts(centers, radii)
        artifacts = {"constraints": tight.summary()}
        if result.stdout.strip() or result.stderr.strip():
            artifacts["output"] = result.tail(1000)
        return Evaluation(
            status=EvalStatus.OK,
            fitness=total,
            metrics={
                "sum_radii": total,
                "min_radius": min(radii),
                "max_radius": max(radii),
                "run_s": result.wall_s,
                "cpu_s": cpu_s,
            },
            descriptors=features(centers, radii, tight, code_chars),
            artifacts=artifacts,
        )


def _children_cpu_s() -> float:
    """User and system CPU seconds of every child this process has waited for, so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
