"""A torch.profiler summary of a few timed training steps, for the candidate's feedback (never its score).

The harness asks for it through the training program's environment (``PROFILE_ENV``: the
first step to profile and how many); ``evolve.harness.stream`` starts the profiler when
that step begins, times the program's waits for batches, stops it after the last profiled
step, and once the checkpoint is saved sends the summary (``summarize``) to the harness as
one ``profile`` report. The summary is computed in the candidate's process, so the harness
treats it as the candidate's word: ``sanitize`` keeps only known fields of bounded size,
and ``describe`` turns it into the feedback text children's prompts show. The score path
never reads it.

Shares of the profiled window's wall time: matrix products, attention kernels, the
optimizer step (everything under ``Optimizer.step``, the record torch's optimizers make),
waiting for batches, the rest, and on a GPU idle time (wall time with no kernel running).
Each op's self time (each kernel's time, on a GPU) goes to its outermost classified
ancestor-or-self, so a matrix product inside the optimizer step or an attention op counts
there. MFU is the achieved matrix-product FLOP/s (torch.profiler's ``with_flops`` counts)
over the device's dense bf16 peak, where known.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import time
from typing import Any

PROFILE_ENV = "EVOLVE_PROFILE_STEPS"
"""``"FIRST COUNT"``: profile the steps numbered FIRST+1 .. FIRST+COUNT (one-based, all steps counted)."""
MAX_OPS = 6
MAX_NAME = 50
# Dense bf16 tensor-core peaks from NVIDIA's data sheets (H100/H200 SXM: 989 TFLOP/s; A100: 312).
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12}
CATEGORIES = ("optimizer", "attention", "matmul")
SKIPPED = ("[memory]", "[OutOfMemory]", "profiler::", "ProfilerStep")  # bookkeeping, not work


def requested(environ: dict[str, str] | os._Environ = os.environ) -> tuple[int, int] | None:
    """(first, count) from the environment, or None when the harness asked for no profile."""
    try:
        first, count = (int(v) for v in environ.get(PROFILE_ENV, "").split())
    except ValueError:
        return None
    return (first, count) if first >= 0 and count > 0 else None


@functools.cache
def category(name: str) -> str | None:
    """The share an op or kernel named ``name`` counts in, or None (its parent decides)."""
    low = name.lower()
    if low.startswith("optimizer.step") or low.startswith("optimizer.zero_grad"):
        return "optimizer"
    if "attention" in low or "flash" in low or "sdpa" in low or "fmha" in low:
        return "attention"
    if any(k in low for k in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "gemm")):
        return "matmul"
    if any(k in low for k in ("cutlass", "cublas", "xmma", "wgmma", "_mm_", "triton_tem")):
        return "matmul"
    return None


class StepProfiler:
    """Profiles steps ``first+1 .. first+count`` of this process; ``report`` summarises them.

    Inside the timed window it only starts and stops the profiler; reading the events and
    summarising them (the costly part) waits for ``report``, which the stream calls once the
    checkpoint is saved, so the candidate's training time pays the least.
    """

    def __init__(self, first: int, count: int) -> None:
        self.first, self.count = first, count
        self.profiler: Any = None
        self.started = self.wall_s = 0.0
        self.steps = self.tokens = 0
        self.wait_s = 0.0
        self.window_s = 0.0  # time spent starting and stopping inside the timed window
        self.peak_memory_mb: float | None = None
        self.done = False
        self.ends: dict[int, float] = {}

    @property
    def active(self) -> bool:
        return self.profiler is not None and not self.done

    def after_step(self, steps: int, tokens: int) -> None:
        """Call after step ``steps`` (one-based) ended."""
        if self.active:
            self.tokens += tokens
            if steps >= self.first + self.count:
                self.stop(steps - self.first)
        elif steps == self.first and self.profiler is None:
            self.start()
        if self.first - self.count <= steps <= self.first + 2 * self.count:
            self.ends[steps] = time.perf_counter()  # step times around the profile: its cost

    def start(self) -> None:
        begin = time.perf_counter()
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if self.cuda:
            activities.append(ProfilerActivity.CUDA)
            torch.cuda.reset_peak_memory_stats()
        self.profiler = profile(activities=activities, with_flops=True)
        self.profiler.__enter__()
        self.started = time.perf_counter()
        self.window_s += self.started - begin

    @property
    def cuda(self) -> bool:
        import torch

        return torch.cuda.is_available() and torch.cuda.is_initialized()

    def waited(self, seconds: float) -> None:
        """The program waited ``seconds`` for a batch (counted while profiling)."""
        if self.active:
            self.wait_s += seconds

    def stop(self, steps: int) -> None:
        stopping = time.perf_counter()
        self.wall_s, self.steps = stopping - self.started, steps
        self.profiler.__exit__(None, None, None)
        if self.cuda:
            import torch

            self.peak_memory_mb = torch.cuda.max_memory_allocated() / 2**20
        else:
            self.peak_memory_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        self.done = True
        self.window_s += time.perf_counter() - stopping

    def abandon(self) -> None:
        """Stop a profile the harness's stop cut short (it is not reported)."""
        if self.active:
            self.profiler.__exit__(None, None, None)
            self.done = True

    def report(self) -> dict[str, Any] | None:
        """The summary of the profiled steps (None unless they all ran); computed once."""
        if not self.done or self.profiler is None or not self.steps:
            return None
        begin = time.perf_counter()
        cuda, wall = self.cuda, self.wall_s
        events = self.profiler.profiler.kineto_results.events()
        summary = summarize(events, wall_s=wall, steps=self.steps, tokens=self.tokens, cuda=cuda)
        self.profiler = None
        shares = summary["shares"]
        shares["data"] = min(1.0, self.wait_s / wall) if wall > 0 else 0.0
        shares["other"] = max(0.0, 1.0 - sum(shares.values()))
        summary["peak_memory_mb"] = self.peak_memory_mb
        summary["device"] = "cpu"
        if cuda:
            import torch

            name = summary["device"] = torch.cuda.get_device_name()
            peak = next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)
            if peak and summary.get("tflops"):
                summary["mfu"] = summary["tflops"] * 1e12 / peak
        summary["window_s"] = self.window_s
        for name, low in (("before", self.first - self.count), ("after", self.first + self.count)):
            if low in self.ends and low + self.count in self.ends:
                span = self.ends[low + self.count] - self.ends[low]
                summary[f"step_s_{name}"] = span / self.count
        summary["report_s"] = time.perf_counter() - begin
        return summary


def summarize(events, *, wall_s: float, steps: int, tokens: int, cuda: bool) -> dict[str, Any]:
    """The summary of a profile's raw events (``kineto_results.events()``) over ``wall_s`` seconds.

    The raw events are read directly: building torch's ``FunctionEvent`` objects costs several
    times more. Ops nest by time on each thread (an op inside another's interval is its
    child); a kernel belongs to the op whose correlation id it carries, as in torch's own
    parsing. GPU user annotations (``record_function`` ranges and compiled graphs' calls seen
    on the GPU's timeline) span kernels and are skipped, as torch's own tables skip them. On a
    GPU the times are the kernels', else the ops' self times.
    """
    from torch.autograd import DeviceType

    ops, kernels, flops = [], {}, 0.0
    for event in events:
        name = event.name()
        if name.startswith(SKIPPED):
            continue
        if event.device_type() == DeviceType.CPU:
            if event.linked_correlation_id() == 0 and not event.is_async():
                ops.append(
                    (
                        event.start_thread_id(),
                        event.start_ns(),
                        -event.end_ns(),
                        name,
                        event.correlation_id(),
                    )
                )
                flops += float(event.flops() or 0)
        elif cuda and not event.is_user_annotation():  # a range around kernels, not a kernel
            kernels.setdefault(event.linked_correlation_id(), []).append(
                (name, event.duration_ns())
            )
    ops.sort()
    spent = {name: 0.0 for name in CATEGORIES}
    by_name: dict[str, float] = {}
    busy = 0.0
    # [thread, end, category, time in children] of each op enclosing the current one
    stack: list[list] = []
    rows = []
    for thread, begin, neg_end, name, corr in ops:
        while stack and (stack[-1][0] != thread or stack[-1][1] <= begin):
            stack.pop()
        end = -neg_end
        kind = (stack[-1][2] if stack else None) or category(name)  # the outermost one wins
        if stack:
            stack[-1][3] += end - begin
        node = [thread, end, kind, 0]
        stack.append(node)
        rows.append((name, corr, begin, end, kind, node))
    owned = [
        (kernels.get(corr, []) if cuda else [(name, end - begin - node[3])], kind)
        for name, corr, begin, end, kind, node in rows
    ]
    linked = {row[1] for row in rows}  # kernels no op launched (e.g. compiled code's) count too
    owned += [(pieces, None) for corr, pieces in kernels.items() if corr not in linked]
    for pieces, kind in owned:
        for piece, ns in pieces:
            if ns <= 0:
                continue
            us = ns / 1e3
            by_name[piece] = by_name.get(piece, 0.0) + us
            busy += us
            share = kind or category(piece)
            if share is not None:
                spent[share] += us
    total_us = wall_s * 1e6
    shares = {name: min(1.0, us / total_us) for name, us in spent.items()} if total_us else {}
    if cuda and total_us:
        shares["idle"] = max(0.0, 1.0 - busy / total_us)
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:MAX_OPS]
    return {
        "steps": steps,
        "seconds": wall_s,
        "tokens_per_s": tokens / wall_s if wall_s > 0 else 0.0,
        "tflops": flops / wall_s / 1e12 if wall_s > 0 else 0.0,
        "shares": shares,
        "top": [[name[:MAX_NAME], us / 1e6] for name, us in top],
        "timer": "kernels" if cuda else "CPU ops",
    }


def sanitize(raw: str) -> dict[str, Any] | None:
    """The summary from a ``profile`` report: known fields only, bounded, or None when malformed."""
    try:
        data = json.loads(raw)
        out: dict[str, Any] = {
            k: float(data[k])
            for k in (
                "steps",
                "seconds",
                "tokens_per_s",
                "tflops",
                "peak_memory_mb",
                "mfu",
                "window_s",
                "report_s",
                "step_s_before",
                "step_s_after",
            )
            if k in data
        }
        out["shares"] = {
            str(k)[:20]: float(v) for k, v in list(dict(data.get("shares", {})).items())[:8]
        }
        out["top"] = [[str(n)[:MAX_NAME], float(s)] for n, s in list(data.get("top", []))[:MAX_OPS]]
        out["device"] = str(data.get("device", ""))[:60]
        out["timer"] = str(data.get("timer", ""))[:20]
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return out


def describe(summary: dict[str, Any]) -> str:
    """The summary as feedback text: top ops first, the totals last (prompts keep a text's end)."""
    shares = summary.get("shares", {})
    lines = []
    if summary.get("top"):
        lines.append(
            f"top {summary.get('timer') or 'ops'} by self time: "
            + "; ".join(f"{name} {seconds * 1e3:.1f} ms" for name, seconds in summary["top"])
        )
    if shares:
        ordered = sorted(shares.items(), key=lambda kv: -kv[1])
        lines.append("share of wall time: " + ", ".join(f"{k} {v:.0%}" for k, v in ordered))
    parts = [
        f"profile of {summary.get('steps', 0):.0f} timed steps ({summary.get('seconds', 0.0):.2f} s "
        f"on {summary.get('device') or '?'}, as reported from the training process): "
        f"{summary.get('tokens_per_s', 0.0):,.0f} tokens/s",
        f"peak memory {summary['peak_memory_mb']:,.0f} MiB" if "peak_memory_mb" in summary else "",
        f"matmul {summary.get('tflops', 0.0):.3g} TFLOP/s",
        f"MFU {summary['mfu']:.1%}" if "mfu" in summary else "MFU n/a",
    ]
    lines.append(", ".join(p for p in parts if p))
    return "\n".join(lines)
