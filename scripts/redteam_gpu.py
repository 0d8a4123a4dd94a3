"""The red team's GPU part in one go: kernel cheats through ``KernelFitness.evaluate`` on a real GPU.

Each candidate (honest or cheating) is evaluated with the kernels fitness on a problem of our
suite; the table says whether each was caught with the expected reason. Results (JSON) and
the full artifacts go to ``$OUT`` (default ./redteam-gpu).

    python scripts/redteam_gpu.py                      # GPU: rmsnorm, full rounds, ~2.5 min
    python scripts/redteam_gpu.py --smoke              # GPU: rmsnorm only, fewer rounds, ~2 min
    python scripts/redteam_gpu.py --device cpu --tiny  # CPU check of the script (Triton interpreter)

Verdicts: caught (refused with the expected reason), no gain (scored, but not above the honest
kernel), NOT CAUGHT, FALSE REJECTION (an honest kernel refused). Exit status 1 on either of
the last two.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HONEST = textwrap.dedent(
    """
    import torch

    def run(x, weight, eps, y):
        xf = x.float()
        y.copy_((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(y.dtype))
    """
)


def cache_keyed_on(key: str) -> str:
    """A kernel that computes once per value of ``key`` (an expression of its arguments) and then
    replays the cached answer."""
    return textwrap.dedent(
        f"""
        import torch
        cache = {{}}

        def run(x, weight, eps, y):
            key = {key}
            if key not in cache:
                xf = x.float()
                y.copy_((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(y.dtype))
                cache[key] = y.clone()
            y.copy_(cache[key])
        """
    )


CHEATS = {
    "patched CUDA events": (
        "import torch\ntorch.cuda.Event.elapsed_time = lambda self, end: 1e-6\n" + HONEST,
        r"elapsed_time|timer|patched",
    ),
    "patched perf_counter": (
        "import time\n_real = time.perf_counter\ntime.perf_counter = lambda: 0.0\n" + HONEST,
        r"perf_counter|timer|patched|clock",
    ),
    "lazy output tensor": (
        textwrap.dedent(
            """
            import torch

            class Lazy(torch.Tensor):
                pass

            def run(x, weight, eps, y):
                xf = x.float()
                out = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(y.dtype)
                y.set_(out.as_subclass(Lazy))
            """
        ),
        r"replaced|subclass|reshaped|proxy",
    ),
    "outputs cached across calls": (
        textwrap.dedent(
            """
            import torch
            calls, cache = [0], {}

            def run(x, weight, eps, y):
                calls[0] += 1
                if calls[0] <= 2:
                    xf = x.float()
                    y.copy_((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(y.dtype))
                    cache["y"] = y.clone()
                else:
                    y.copy_(cache["y"])
            """
        ),
        r"although the correctness rounds passed|cache",
    ),
    "NaN output": (
        "import torch\n\ndef run(x, weight, eps, y):\n    y.fill_(float('nan'))\n",
        r"nan|finite",
    ),
    "work handed to an import-time thread": (
        textwrap.dedent(
            """
            import queue, threading, time
            import torch
            jobs = queue.Queue()

            def worker():
                while True:
                    x, weight, eps, y = jobs.get()
                    xf = x.float()
                    y.copy_((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(y.dtype))

            threading.Thread(target=worker, daemon=True).start()

            def run(x, weight, eps, y):
                jobs.put((x, weight, eps, y))  # return at once; the result lands a moment later
                time.sleep(0)
            """
        ),
        r"thread|wrong outputs|incorrect|elements",
    ),
    "network connection": (
        "import socket\nsocket.create_connection(('8.8.8.8', 53), timeout=3)\n" + HONEST,
        r"unreachable|PermissionError|OSError|timed out",
    ),
    "cache keyed on input pointers": (
        cache_keyed_on("(x.data_ptr(), weight.data_ptr())"),
        r"round 1: .*within",
    ),
    "work on a side stream the caller does not wait for": (
        textwrap.dedent(
            """
            import torch
            side = torch.cuda.Stream()

            def run(x, weight, eps, y):
                with torch.cuda.stream(side):  # no wait_stream: the caller's stream runs on
                    xf = x.float()
                    y.copy_((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(y.dtype))
            """
        ),
        r"wrong outputs|NaN|incorrect|elements|faster than the roofline",
    ),
    "answers replayed from inputs predicted at import": (
        textwrap.dedent(
            """
            import os, types, torch
            from evolve.benchmarks.kernels import inputs, spec
            from evolve.benchmarks.kernels.fitness import SUITE

            problem = spec.load_problem(SUITE / "rmsnorm")
            workload = problem.workloads[0]
            maker = inputs.InputMaker(problem, workload, torch.device("cuda"), types.SimpleNamespace(run=None))
            answers = {}
            for part in [("round", r) for r in range(3)] + [("timed", 0)]:
                x, weight, eps = maker.make(inputs.derive_seed(int(os.environ["EVOLVE_SEED"]), workload.uuid, *part))
                xf = x.float()
                y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)
                answers[tuple(x.flatten()[:8].float().tolist())] = y

            def run(x, weight, eps, y):
                found = answers.get(tuple(x.flatten()[:8].float().tolist()))
                y.copy_(found) if found is not None else y.zero_()
            """
        ),
        r"round 0: .*(zero|within)",
    ),
}
# Caught only by the probe pairs among the audited calls (at least three audits): run strictly.
STRICT_CHEATS = {
    "cache keyed on sampled input values": (
        cache_keyed_on("tuple(x[0, :4].float().tolist())"),
        r"gave wrong outputs",
    ),
}


def tiny_problem(root: Path) -> Path:
    """The owner's tiny RMSNorm problem (H=64), for a CPU check of this script."""
    sys.path.insert(
        0, str(Path(__file__).resolve().parents[1] / "tests" / "benchmarks" / "kernels")
    )
    from kernels_fixtures import tiny_rmsnorm

    tiny_rmsnorm(root, rows=(33,))
    (root / "calibration.json").write_text(
        json.dumps(
            {
                "device": "test",
                "bandwidth_bytes_per_s": 1e9,
                "matrix_flops_per_s": {"bfloat16": 1e11},
            }
        )
    )
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument(
        "--tiny", action="store_true", help="the tiny CPU problem (with --device cpu)"
    )
    parser.add_argument("--smoke", action="store_true", help="one problem, fewer rounds")
    args = parser.parse_args(argv)
    out = Path(os.environ.get("OUT", "redteam-gpu"))
    out.mkdir(parents=True, exist_ok=True)

    from evolve.benchmarks.kernels.fitness import KernelFitness

    from evolve.harness.fitness import EvalContext, evaluate_safely

    scratch = Path(tempfile.mkdtemp(prefix="redteam-gpu-"))
    if args.tiny:
        os.environ["TRITON_INTERPRET"] = "1"
        dataset = tiny_problem(scratch / "problems")
        problems = {
            "tiny_rmsnorm": {
                "dataset": str(dataset),
                "calibration": str(dataset / "calibration.json"),
            }
        }
    else:
        problems = {"rmsnorm": {}}
    extra = {"rounds": 2, "warmup": 1, "iters": 4, "audits": 1} if (args.smoke or args.tiny) else {}
    if args.smoke and not args.tiny:
        extra["quick_calibration"] = True
    rows, failures = [], 0
    for problem, options in problems.items():
        fitness = KernelFitness(
            problem=problem, device=args.device, baseline="eager", **options, **extra
        )
        honest: float | None = None
        cases = [("honest (seed 1)", HONEST, None, 1, False), ("honest (seed 2)", HONEST, None, 2, False),
                 ("honest (strict)", HONEST, None, 3, True)]  # fmt: skip
        cases += [(name, code, reason, 1, False) for name, (code, reason) in CHEATS.items()]
        cases += [(name, code, reason, 1, True) for name, (code, reason) in STRICT_CHEATS.items()]
        for name, code, reason, seed, strict in cases:
            workdir = scratch / re.sub(r"\W+", "_", f"{problem}_{name}")
            workdir.mkdir(parents=True)
            (workdir / "kernel.py").write_text(code)
            start = time.monotonic()
            ctx = EvalContext(seed=seed, timeout_s=600, strict=strict)
            ev = evaluate_safely(fitness, workdir, ctx)
            text = "\n".join(str(v) for v in ev.artifacts.values())
            if reason is None:
                verdict = "passed" if ev.ok else "FALSE REJECTION"
                if ev.ok:
                    honest = max(honest or 0.0, ev.fitness)
            elif not ev.ok:
                verdict = "caught" if re.search(reason, text, re.I) else "caught (other reason)"
            else:  # scored: a cheat that gains nothing over the honest kernel is harmless here
                verdict = "no gain" if honest is not None and ev.fitness <= honest else "NOT CAUGHT"
            failures += verdict in ("FALSE REJECTION", "NOT CAUGHT")
            error = ev.artifacts.get("error", "")
            rows.append(
                {
                    "problem": problem,
                    "candidate": name,
                    "status": str(ev.status),
                    "verdict": verdict,
                    "fitness": ev.fitness,
                    "reason": error[:300],
                    "wall_s": round(time.monotonic() - start, 1),
                    "artifacts": {k: str(v)[-4000:] for k, v in ev.artifacts.items()},
                }
            )
            print(
                f"{problem:<14} {name:<38} {verdict:<22} {ev.status!s:<9} {error[:90]}", flush=True
            )
    (out / "redteam_gpu.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    print(
        f"\n{len(rows)} candidates, {failures} wrong verdict(s); results in {out / 'redteam_gpu.json'}"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
