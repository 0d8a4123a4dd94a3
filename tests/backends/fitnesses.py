"""Fitnesses for the backend tests: they score numbers, and leave a trace of each run on disk.

A trace file per evaluation run (``<candidate id>.<pid>.<ns>.json`` in ``trace_dir``) says
which process ran it, with which GPU, so tests can kill that process or count the runs.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

from evolve.harness.fitness import EvalContext, Limits, run_sandboxed, sandbox_failure
from evolve.types import Descriptor, Direction, EvalStatus, Evaluation, Objective, content_hash

TARGET = {"A": 3.0, "B": 12, "C": 0.25}
SLEEPER = "import os, time; open('child.pid', 'w').write(str(os.getpid())); time.sleep(600)"


def read_params(text: str) -> dict[str, float]:
    """The numbers assigned at the top level of ``text`` (read with literal_eval, never run)."""
    values = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            values[node.targets[0].id] = ast.literal_eval(node.value)
    return values


def traces(trace_dir: Path) -> list[dict]:
    """Every trace written so far, oldest first."""
    found = [json.loads(p.read_text()) for p in Path(trace_dir).glob("*.json")]
    return sorted(found, key=lambda t: t["ns"])


class Traced:
    """Maximise -sum((x - target)^2) over params.py; optionally sleep, hang, die or run a sleeper.

    Args:
        sleep_s: seconds to sleep before scoring (a stand-in for real work).
        trace_dir: where to write a trace per run (None: no traces).
        hang_s: seconds the harness itself hangs (past its deadline, to test timeouts).
        die: "always" kills the process running the harness; "once" does so only on the
            first run of each candidate (needs ``trace_dir``).
        sleeper: run a candidate process that sleeps for 10 minutes, under the sandbox.
        peek: a path a candidate process tries to read, under the sandbox; its trace says
            whether it ``read`` it or was ``refused``.
    """

    objective = Objective(name="score", direction=Direction.MAXIMIZE)
    descriptors = (
        Descriptor(name="a", low=0.0, high=10.0, bins=5),
        Descriptor(name="b", low=0.0, high=32.0, bins=4),
    )

    def __init__(
        self,
        *,
        sleep_s: float = 0.0,
        trace_dir: str | None = None,
        hang_s: float = 0.0,
        die: str | None = None,
        sleeper: bool = False,
        peek: str | None = None,
    ) -> None:
        self.sleep_s, self.hang_s, self.die, self.sleeper = sleep_s, hang_s, die, sleeper
        self.peek = peek
        self.trace_dir = Path(trace_dir) if trace_dir else None

    def _trace(self, candidate: str, ctx: EvalContext, **extra: object) -> int:
        """Write this run's trace; returns how many runs of ``candidate`` came before it."""
        if self.trace_dir is None:
            return 0
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        before = len(list(self.trace_dir.glob(f"{candidate}.*.json")))
        ns = time.time_ns()
        trace = {
            "candidate": candidate,
            "pid": os.getpid(),
            "ns": ns,
            "gpu": ctx.gpu,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "cmdline": Path("/proc/self/cmdline")
            .read_bytes()
            .replace(b"\0", b" ")
            .decode()
            .strip(),
            **extra,
        }
        path = self.trace_dir / f"{candidate}.{os.getpid()}.{ns}.json"
        path.with_suffix(".tmp").write_text(json.dumps(trace))
        path.with_suffix(".tmp").rename(path)
        return before

    def evaluate(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        files = {
            p.relative_to(workdir).as_posix(): p.read_text()
            for p in sorted(workdir.rglob("*"))
            if p.is_file()
        }
        candidate = content_hash(files)
        runs_before = self._trace(candidate, ctx)
        if self.die == "always" or (self.die == "once" and runs_before == 0):
            os.kill(os.getpid(), signal.SIGKILL)
        if self.sleeper:
            result = run_sandboxed(
                [sys.executable, "-c", SLEEPER], cwd=workdir, limits=Limits(timeout_s=ctx.timeout_s)
            )
            child = (workdir / "child.pid").read_text() if (workdir / "child.pid").exists() else ""
            self._trace(f"{candidate}-child", ctx, child=int(child or 0))
            failure = sandbox_failure(result)
            if failure is not None:
                return failure
        if self.peek:
            code = f"try:\n    open({self.peek!r}).read(); print('read')\nexcept OSError:\n    print('refused')"
            result = run_sandboxed(
                [sys.executable, "-c", code], cwd=workdir, limits=Limits(timeout_s=ctx.timeout_s)
            )
            self._trace(f"{candidate}-peek", ctx, peeked=result.stdout.strip())
        time.sleep(self.sleep_s + self.hang_s)
        params = read_params(files["params.py"])
        score = -sum((float(params[k]) - v) ** 2 for k, v in TARGET.items())
        return Evaluation(
            status=EvalStatus.OK,
            fitness=score,
            metrics={"score": score},
            descriptors={"a": float(params["A"]), "b": float(params["B"])},
        )


def other_version_task(fitness, job, harness, expected, unseen):
    """A Ray task as a node running other code might run it: it reports other harness files,
    then evaluates anyway (here: hangs); its pid goes to ``fitness.trace_dir/pid``."""
    (fitness.trace_dir / "pid").write_text(str(os.getpid()))
    yield {"host": "elsewhere", "pid": os.getpid(), "gpu": None, "harness": "other"}
    time.sleep(600)
    yield None


CHILD_GPU = "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES'))"


class GpuProbe(Traced):
    """Traced's score, after a matmul on the evaluation's GPU and checks of the GPU it was given.

    Metrics: ``tflops`` of a bf16 ``size``x``size`` matmul (fp32 and 256 on CPU),
    ``matmul_ok`` (it matches float64 on a few rows), ``cuda_devices`` seen by torch,
    ``env_matches_ray`` (CUDA_VISIBLE_DEVICES is what ``ray.get_gpu_ids()`` says) and
    ``candidate_sees_gpu`` (a sandboxed candidate process gets the same GPUs).

    Args:
        size: matrix size on a GPU.
        require_gpu: an evaluation without a CUDA device is INVALID (else it runs on CPU).
    """

    def __init__(self, *, size: int = 8192, require_gpu: bool = True, **traced: object) -> None:
        super().__init__(**traced)
        self.size, self.require_gpu = size, require_gpu

    def evaluate(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        import torch

        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        try:
            import ray

            ray_ids = [str(i) for i in ray.get_gpu_ids()] if ray.is_initialized() else None
        except ImportError:
            ray_ids = None
        if self.require_gpu and not torch.cuda.is_available():
            return Evaluation(
                status=EvalStatus.INVALID,
                artifacts={
                    "error": f"no CUDA device in the worker (CUDA_VISIBLE_DEVICES={visible})"
                },
            )
        gpu = torch.cuda.is_available()
        device, n = ("cuda", self.size) if gpu else ("cpu", 256)
        dtype = torch.bfloat16 if gpu else torch.float32
        generator = torch.Generator(device=device).manual_seed(ctx.seed)
        a = torch.randn(n, n, device=device, dtype=dtype, generator=generator)
        b = torch.randn(n, n, device=device, dtype=dtype, generator=generator)
        c = a @ b  # warm-up, and the product checked below
        reps = 10
        if gpu:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            a @ b
        if gpu:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        exact = a[:4].double().cpu() @ b.double().cpu()
        matmul_ok = torch.allclose(c[:4].double().cpu(), exact, rtol=0.05, atol=0.05 * n**0.5)
        child = run_sandboxed(
            [sys.executable, "-c", CHILD_GPU],
            cwd=workdir,
            limits=Limits(timeout_s=ctx.timeout_s, memory_bytes=None),
            env=ctx.env(),
        )
        scored = super().evaluate(workdir, ctx)
        if not scored.ok:
            return scored
        metrics = {
            **scored.metrics,
            "tflops": 2 * n**3 * reps / seconds / 1e12,
            "matmul_ok": float(matmul_ok),
            "cuda_devices": float(torch.cuda.device_count()),
            "env_matches_ray": float(ray_ids is not None and ray_ids == (visible or "").split(",")),
            "candidate_sees_gpu": float(child.stdout.strip() == str(ctx.gpu)),
        }
        name = torch.cuda.get_device_name(0) if gpu else "cpu"
        artifacts = {
            "device": name,
            "cuda_visible_devices": str(visible),
            "ray_gpu_ids": ",".join(ray_ids or []),
            "candidate_cuda_visible_devices": child.stdout.strip() or child.tail(500),
        }
        return replace(scored, metrics=metrics, artifacts=artifacts)


class Outlasting:
    """Runs a sandboxed sleeper tagged ``tag`` that outlives the driver's deadline, and reports its GPU env."""

    objective = Objective(name="score", direction=Direction.MAXIMIZE)
    descriptors = ()
    visible_at_import = os.environ.get("CUDA_VISIBLE_DEVICES")

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def evaluate(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        if self.tag == "report":
            seen = {
                "at_import": type(self).visible_at_import,
                "at_eval": os.environ.get("CUDA_VISIBLE_DEVICES"),
            }
            return Evaluation(
                status=EvalStatus.OK, fitness=0.0, artifacts={"seen": json.dumps(seen)}
            )
        result = run_sandboxed(
            [sys.executable, "-c", f"import time; time.sleep(120)  # {self.tag}"],
            cwd=workdir,
            limits=Limits(timeout_s=300),
            env=ctx.env(),
        )
        return sandbox_failure(result) or Evaluation(status=EvalStatus.OK, fitness=1.0)


CHILD_CORES = "import os; print(sorted(os.sched_getaffinity(0)), os.environ['OMP_NUM_THREADS'])"


class CoreReport:
    """Reports the cores its worker runs on and those a sandboxed command it starts gets."""

    objective = Objective(name="score", direction=Direction.MAXIMIZE)
    descriptors = ()

    def evaluate(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        result = run_sandboxed(
            [sys.executable, "-c", CHILD_CORES], cwd=workdir, limits=Limits(timeout_s=60)
        )
        seen = {"worker": sorted(os.sched_getaffinity(0)), "command": result.stdout.strip()}
        return sandbox_failure(result) or Evaluation(
            status=EvalStatus.OK, fitness=0.0, artifacts={"seen": json.dumps(seen)}
        )
