"""The process that measures a candidate kernel: it owns the seed, the inputs, the clock and every check.

Run by the harness (``process.prepare_timer``) as ``python -P -m evolve.benchmarks.kernels.timer
DEVICE`` in the folder that will hold the candidate's files; it talks the harness layer's
protocol (``evolve.harness.protocol``: the job with a nonce on stdin, the verdict as the line
carrying it). At start it makes itself undumpable (no process of its user may ptrace it or
open its memory and fds) and starts the candidate's process (``runner.py``) as its child,
connected by a unix socket pair and with no other way back: the child's stdout and stderr go
to this process's stderr, its stdin is empty. No Python frame of this process is reachable
from the candidate's code.

For each workload:

1. ``rounds`` correctness rounds: fresh inputs from the evaluation's seed, written into one
   arena (``arena.py``), so every round's inputs sit at the same addresses (a cache keyed on
   the pointer goes stale); the candidate's outputs are compared here with the reference run
   here on this process's own copy of the inputs;
2. ``repeats`` timing loops: a warm-up batch, then the timed calls in batches of ``batch``.
   Each batch gets an arena of its own, allocated and filled here (the same values at a new
   address per call, or fresh values with ``inputs=fresh``; ``audits`` calls at positions drawn
   from ``secrets`` are probes whose inputs have half their rows changed, then the other half,
   ``pool.perturb_rows``) and handed to the candidate's process only with the message that
   starts the clock. The clock (``time.perf_counter_ns`` of this process) runs from just
   before that message to the moment this process has read a sample of every call's outputs
   at positions drawn from ``secrets`` after the candidate's "done": an output not yet
   written is still NaN there. A batch's time divided by its calls is one timing.
   Every call's outputs, warm-up included, are then compared with the reference.

The verdict holds raw facts the harness turns into a score: error statistics per round,
the per-call times of each batch, and the cheat or error seen. The candidate's process can
crash, lie or exit; it never holds the seed, a clock that counts, or the verdict's channel.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from evolve.harness.protocol import SAFE_PATH, make_undumpable, serve_job

from .process import exit_now

RUNNER = "evolve.benchmarks.kernels.runner"
_NOW_NS = time.perf_counter_ns
_MONOTONIC = time.monotonic
SAMPLES_PER_OUTPUT = 32  # output positions read per call before the clock stops
FALLBACK_L2_BYTES = 64 << 20


class RunnerGone(RuntimeError):
    """The candidate's process closed the channel (it exited or crashed)."""


class Session:
    """The candidate's process, started by this one, and the messages sent to it."""

    def __init__(self, device: str, cwd: Path | None = None):
        from . import wire

        self.wire = wire
        mine, theirs = wire.pair()
        self.end = mine
        self.process = subprocess.Popen(
            [sys.executable, *SAFE_PATH, "-m", RUNNER, device, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno(),
            stderr=sys.stderr.fileno(), cwd=cwd,
        )  # fmt: skip
        theirs.close()

    def ask(self, message: dict[str, Any], fds: Sequence[int] = ()) -> dict[str, Any]:
        """Send ``message`` and return the answer (``RunnerGone`` when there is none)."""
        try:
            self.wire.send(self.end, message, tuple(fds))
            answer, extra = self.wire.receive(self.end)
        except (self.wire.ChannelClosed, BrokenPipeError, ConnectionResetError) as exc:
            raise RunnerGone(self.gone()) from exc
        for fd in extra:
            os.close(fd)
        return answer

    def gone(self) -> str:
        """Why the candidate's process no longer answers, in words."""
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "the candidate's process closed its channel to the harness and kept running"
        return f"the candidate's process exited (status {code}) before answering the harness"

    def close(self) -> None:
        """Ask the candidate's process to exit, then end it."""
        with contextlib.suppress(Exception):
            self.wire.send(self.end, {"op": "end"})
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.end.close()


class Cheat(Exception):
    """What the candidate did that the benchmark forbids; the message says what."""


class Failed(Exception):
    """The candidate's call raised (an error, not a cheat); the message and traceback say where."""

    def __init__(self, message: str, trace: str = ""):
        super().__init__(message)
        self.trace = trace


def check_answer(answer: dict[str, Any], when: str) -> dict[str, Any]:
    """``answer`` when the candidate's process did what was asked; else the cheat or error it reports."""
    if "cheat" in answer:
        raise Cheat(f"{when}: {answer['cheat']}")
    if "error" in answer or "fatal" in answer:
        raise Failed(f"{when}: {answer.get('error') or answer.get('fatal')}", str(answer.get("traceback", "")))
    return answer


class Batch:
    """Calls laid out in one arena: this process's copies of their inputs, and the outputs' places."""

    def __init__(self, calls: Sequence[Sequence[Any]], maker: Any, device: Any):
        from . import arena

        self.arena_module = arena
        layout = arena.Layout()
        self.inputs = list(calls)
        self.placed: list[tuple[list[Any], list[Any]]] = []
        for made in self.inputs:
            args = []
            for value in made:
                if hasattr(value, "stride"):
                    strides = tuple(value.stride())
                    args.append(layout.place(tuple(value.shape), value.dtype,
                                             strides if min(strides, default=0) >= 0 else None))  # fmt: skip
                else:
                    args.append(value)
            outs = [layout.place(shape, dtype) for shape, dtype in maker.output_shapes()]
            self.placed.append((args, outs))
        self.arena = arena.Arena(layout.nbytes, device)
        self.write()

    def write(self) -> None:
        """Write every call's inputs into the arena, and NaN (0 for integers) into its outputs."""
        arena = self.arena_module
        for made, (args, outs) in zip(self.inputs, self.placed, strict=True):
            for value, placed in zip(made, args, strict=True):
                count = arena.span(placed.shape, placed.strides) if isinstance(placed, arena.Placed) else 0
                if count:  # the storage the tensor spans, its broadcast's zero strides kept
                    flat = self.arena.view(arena.Placed(placed.offset, placed.dtype, (count,), (1,)))
                    source = value if min(placed.strides, default=0) >= 0 else value.contiguous()
                    flat.copy_(source.as_strided((count,), (1,)))
            for placed in outs:
                out = self.arena.view(placed)
                out.fill_(float("nan") if out.dtype.is_floating_point else 0)

    def message(self) -> tuple[dict[str, Any], tuple[int, ...]]:
        """The calls and the arena, as the candidate's process receives them."""
        arena = self.arena_module

        def arg(value: Any) -> dict[str, Any]:
            return {"tensor": value.as_json()} if isinstance(value, arena.Placed) else {"scalar": value}

        share, fds = self.arena.share()
        calls = [{"args": [arg(a) for a in args], "outputs": [arg(o) for o in outs]} for args, outs in self.placed]
        return {"arena": share, "calls": calls}, fds

    def outputs(self, index: int) -> list[Any]:
        """Call ``index``'s outputs, viewing the arena."""
        return [self.arena.view(placed) for placed in self.placed[index][1]]

    def samples(self, generator: Any) -> list[tuple[Any, Any, Any]]:
        """Per floating dtype of the outputs: the arena viewed as that dtype, ``SAMPLES_PER_OUTPUT``
        random element positions in each output of that dtype, and the call each position is in."""
        import torch

        groups: dict[Any, tuple[list[Any], list[int]]] = {}
        for index, (_args, outs) in enumerate(self.placed):
            for placed in outs:
                dtype = getattr(torch, placed.dtype)
                count = self.arena_module.span(placed.shape, placed.strides)
                if dtype.is_floating_point and count:
                    where = torch.randint(count, (SAMPLES_PER_OUTPUT,), generator=generator) + placed.offset // dtype.itemsize
                    positions, calls = groups.setdefault(dtype, ([], []))
                    positions.append(where)
                    calls += [index] * SAMPLES_PER_OUTPUT
        base = self.arena.base
        return [(base.view(dtype), torch.cat(positions).to(base.device), torch.tensor(calls))
                for dtype, (positions, calls) in groups.items()]  # fmt: skip

    @staticmethod
    def unwritten_now(samples: Sequence[tuple[Any, Any, Any]]) -> bool:
        """Whether any sampled output position still holds NaN (one read per dtype)."""
        return any(bool(flat[where].float().isnan().any()) for flat, where, _calls in samples)

    @staticmethod
    def unwritten_calls(samples: Sequence[tuple[Any, Any, Any]]) -> list[int]:
        """The calls with a sampled position still NaN."""
        found: set[int] = set()
        for flat, where, calls in samples:
            found.update(calls[flat[where].float().isnan().cpu()].tolist())
        return sorted(found)

    def close(self) -> None:
        """Free the arena."""
        self.arena.close()


class Measurer:
    """One workload's correctness rounds and timing batches against a session."""

    def __init__(self, session: Session, job: Mapping[str, Any], problem: Any, workload: Any, reference: Any,
                 check: bool = True):  # fmt: skip
        import torch

        from . import compare, inputs, pool

        self.torch, self.compare, self.inputs, self.pool = torch, compare, inputs, pool
        self.session, self.job, self.workload, self.reference, self.check = session, job, workload, reference, check
        self.device = torch.device(job["device"])
        self.maker = inputs.InputMaker(problem, workload, self.device, reference)
        self.seed = int(job["seed"])
        self.flush = None
        if job.get("flush_l2", True) and self.device.type == "cuda":
            props = torch.cuda.get_device_properties(self.device)
            l2 = int(getattr(props, "L2_cache_size", 0) or FALLBACK_L2_BYTES)
            self.flush = torch.empty(2 * l2, dtype=torch.int8, device=self.device)

    def expected(self, made: Sequence[Any]) -> list[Any]:
        with self.torch.no_grad():
            return self.maker.normalize(self.reference.run(*made))

    def stats(self, outs: Sequence[Any], expected: Sequence[Any]) -> list[dict[str, Any]]:
        tol = self.workload.tolerance
        return [self.compare.error_stats(o, e, tol) for o, e in zip(outs, expected, strict=True)]

    def failure(self, stats: Sequence[dict[str, Any]]) -> str | None:
        for index, s in enumerate(stats):
            reason = self.compare.verdict(s, self.workload.tolerance, name=f"output {index}")
            if reason:
                return reason
        return None

    def rounds(self, result: dict[str, Any]) -> bool:
        """The correctness rounds (False, with the result's status set, when one fails)."""
        batch = None
        try:
            for r in range(int(self.job["rounds"])):
                made = self.maker.make(self.inputs.derive_seed(self.seed, self.workload.uuid, "round", r))
                if batch is None:
                    batch = Batch([made], self.maker, self.device)
                    message, fds = batch.message()
                    message = {"op": "go", **message}
                else:  # fresh values at the same addresses
                    batch.inputs = [made]
                    batch.write()
                    message, fds = {"op": "go"}, ()
                self.synchronize()
                check_answer(self.session.ask(message, fds), f"round {r}")
                stats = self.stats([o.clone() for o in batch.outputs(0)], self.expected(made))
                result["rounds"].append(stats)
                reason = self.failure(stats)
                if reason:
                    result.update(status="incorrect", message=f"round {r}: {reason}")
                    return False
            if batch is not None:
                result["kernels"] = check_answer(self.session.ask({"op": "profile"}), "profiling a call").get("kernels", {})
            return True
        finally:
            if batch is not None:
                self.session.ask({"op": "release"})
                batch.close()

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def calls(self, rep: int) -> list[list[Any]]:
        """Inputs of the warm-up and timed calls of repeat ``rep`` (this process's copies), probes included."""
        warmup, iters = int(self.job["warmup"]), int(self.job["iters"])
        uuid, derive = self.workload.uuid, self.inputs.derive_seed
        if self.job.get("inputs", "shifted") == "shifted":  # upstream: the same values at a new address
            same = self.maker.make(derive(self.seed, uuid, "timed", rep))
            made = [same] * (warmup + iters)
        else:
            made = [self.maker.make(derive(self.seed, uuid, "timed", rep, i)) for i in range(warmup + iters)]
        count = min(iters, int(self.job.get("audits", 0)))
        probes = sorted(warmup + i for i in secrets.SystemRandom().sample(range(iters), count))
        generator = self.torch.Generator().manual_seed(secrets.randbits(62))
        n_in = len(made[0])
        masks: list[Any] = []
        for k, i in enumerate(probes):  # in pairs: half of the rows changed, then the other half
            fresh = self.maker.make(derive(self.seed, uuid, "probe", rep, i))
            if k % 2 == 0:
                masks = self.pool.row_masks(made[i][:n_in], generator)
            pair = masks if k % 2 == 0 else [None if m is None else ~m for m in masks]
            changed = [v.clone() if hasattr(v, "clone") else v for v in made[i]]
            self.pool.perturb_rows(changed, fresh, pair)
            made[i] = changed
        return made

    def batch(self, made: Sequence[Sequence[Any]], first: int, timed: bool) -> float:
        """Run calls ``first``... on ``made`` as one batch; its per-call milliseconds (measured here)."""
        batch = Batch(made, self.maker, self.device)
        try:
            message, fds = batch.message()
            samples = batch.samples(self.torch.Generator().manual_seed(secrets.randbits(62)))
            if self.flush is not None:
                self.flush.zero_()
            self.synchronize()
            start = _NOW_NS()
            answer = self.session.ask({"op": "go", **message}, fds)
            unwritten = batch.unwritten_now(samples)  # whatever it answered: an answer is no proof
            elapsed = _NOW_NS() - start
            unwritten_calls = batch.unwritten_calls(samples) if unwritten else []
            check_answer(answer, f"{'timed' if timed else 'warm-up'} call {first}")
            if self.check:
                self.verify(batch, first, unwritten_calls)
            self.session.ask({"op": "release"})
        finally:
            batch.close()
        return elapsed / 1e6 / len(made)

    def verify(self, batch: Batch, first: int, unwritten: Sequence[int]) -> None:
        """Every call's outputs against the reference on this process's copy of its inputs."""
        references: dict[int, list[Any]] = {}
        for index, made in enumerate(batch.inputs):
            if id(made) not in references:
                references[id(made)] = self.expected(made)
            reason = self.failure(self.stats(batch.outputs(index), references[id(made)]))
            if reason:
                raise Cheat(f"timed call {first + index} gave wrong outputs ({reason}) although the correctness "
                            "rounds passed")  # fmt: skip
        if unwritten:
            raise Cheat(f"timed call {first + unwritten[0]}: its outputs were not all written when the candidate's "
                        "process said it was done (they were by the time they were compared)")  # fmt: skip

    def timing(self, rep: int) -> list[float]:
        """Per-call milliseconds of each timed batch of repeat ``rep``."""
        warmup, iters = int(self.job["warmup"]), int(self.job["iters"])
        size = max(1, int(self.job.get("batch", 10)))
        made = self.calls(rep)
        if warmup:
            self.batch(made[:warmup], 0, timed=False)
        times = []
        for first in range(warmup, warmup + iters, size):
            times.append(self.batch(made[first : first + size], first - warmup, timed=True))
        return times


MARKS: list[tuple[str, float]] = []  # (phase, monotonic time it began), reported to the harness


def mark(phase: str) -> None:
    """Phase ``phase`` of this evaluation begins now (the harness turns marks into ``time_<phase>``)."""
    MARKS.append((phase, _MONOTONIC()))


def measure_workload(session: Session, job: Mapping[str, Any], problem: Any, workload: Any,
                     reference: Any) -> dict[str, Any]:  # fmt: skip
    """Correctness rounds and timed batches of one workload: raw facts; ``Cheat`` on a cheat."""
    measurer = Measurer(session, job, problem, workload, reference)
    result: dict[str, Any] = {"uuid": workload.uuid, "status": "ok", "rounds": [], "timings_ms": [], "timer": "host"}
    try:
        mark("correctness")
        if not measurer.rounds(result):
            return result
        mark("timing")
        for rep in range(int(job["repeats"])):
            result["timings_ms"].append(measurer.timing(rep))
    except Failed as exc:
        result.update(status="error", message=str(exc), traceback=exc.trace)
    return result


def time_reference(session: Session, job: Mapping[str, Any], problem: Any, workload: Any,
                   reference: Any) -> list[list[float]]:  # fmt: skip
    """Per-call milliseconds of the reference hosted by ``session``, measured as a candidate's are."""
    measurer = Measurer(session, job, problem, workload, reference, check=False)
    return [measurer.timing(rep) for rep in range(int(job.get("repeats", 1)))]


def run_job(job: dict[str, Any], session: Session) -> dict[str, Any]:
    """A candidate's whole evaluation: load it in its process, measure each workload."""
    import torch

    from . import inputs, spec

    problem = spec.load_problem(job["problem_dir"])
    reference = inputs.load_reference(problem.definition, Path(job["harness_dir"]))
    if job["device"].startswith("cuda") and not torch.cuda.is_available():
        return {"fatal": "the job asks for a CUDA device but torch sees none in the sandbox"}
    entry = job.get("entry") or {"file": "kernel.py", "function": "run", "dps": True}
    mark("candidate_import")
    load = {"op": "load", "entry": entry, "env": job.get("env", {}), "outputs": list(problem.definition.outputs),
            "problem_dir": job["problem_dir"], "harness_dir": job["harness_dir"]}  # fmt: skip
    try:
        check_answer(session.ask(load), "importing the candidate")
    except Failed as exc:
        return {"error": str(exc), "traceback": exc.trace}
    wanted = job.get("workloads")
    results = []
    for workload in problem.workloads:
        if wanted and workload.uuid not in wanted:
            continue
        results.append(measure_workload(session, job, problem, workload, reference))
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return {"workloads": results}


def main() -> int:
    """Start the candidate's process, then serve one job through the harness layer's protocol."""
    make_undumpable()
    device = sys.argv[1]
    session = None
    try:
        import torch  # noqa: F401

        from . import arena, compare, inputs, pool, spec, wire  # noqa: F401

        session = Session(device)
    except Exception as exc:
        failure = f"harness setup failed: {type(exc).__name__}: {exc}"

    def run(job: dict[str, Any]) -> dict[str, Any]:
        if session is None:
            payload = {"fatal": failure}
        else:
            try:
                payload = run_job(job, session)
            except Cheat as exc:
                payload = {"cheat": str(exc)}
            except RunnerGone as exc:
                payload = {"error": str(exc)}
            except Exception as exc:
                payload = {"fatal": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
            mark("process_exit")
            session.close()
        print(flush=True)  # the verdict starts a line of its own
        return {**payload, "marks": MARKS}

    serve_job(run)
    return 0


if __name__ == "__main__":
    exit_now(main())
