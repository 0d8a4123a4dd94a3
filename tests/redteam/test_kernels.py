"""Red team, kernels: hacks through ``KernelFitness.evaluate`` (the owner's anti-cheat suite drives the harness directly).

CPU part: the tiny RMSNorm problem under Triton's interpreter, as in the owner's tests:
class 1 of issue 15 (work outside the timed window: outputs replayed from inputs predicted
at import, caches keyed on the pointer or on a sample of the values, work deferred past the
call), class 3 (state carried between evaluations: files in /dev/shm, /tmp and $HOME,
poisoned harness caches and dataset, a daemon left to serve the next candidate), the
auditor's strict mode (``EvalContext.strict``: more rounds and probes), a returning
solution's lazy value, names of the harness's modules rebound at import, forgers that walk
from their import to the frames of the process hosting them (issue 29 item 5: they scored
0.94 when that process also timed and checked them), and a cross_entropy loss that never
reads the logits.

GPU part (``-m gpu``): patched CUDA events (harmless now), a lazy output tensor, outputs cached across
calls and the driver-frame forger on the real rmsnorm problem of our suite.
"""

from __future__ import annotations

import importlib.util
import json
import textwrap
import uuid
from pathlib import Path

import pytest
from evolve.benchmarks.kernels.fitness import KernelFitness

from evolve.harness.fitness import EvalContext, evaluate_safely
from evolve.types import EvalStatus
from tests.redteam.helpers import Listener, assert_caught, reason

OWNER_TESTS = Path(__file__).resolve().parents[1] / "benchmarks" / "kernels"


def _owner_module(name: str):
    spec = importlib.util.spec_from_file_location(f"redteam_{name}", OWNER_TESTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FIXTURES = _owner_module("kernels_fixtures")
GOOD = textwrap.dedent(
    """
    import torch

    def run(x, weight, eps, y):
        xf = x.float()
        y.copy_((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(y.dtype))
    """
)
FAILED = (EvalStatus.ERROR, EvalStatus.INVALID, EvalStatus.REJECTED)


@pytest.fixture(scope="module")
def fitness(tmp_path_factory):
    patch = pytest.MonkeyPatch()
    patch.setenv("TRITON_INTERPRET", "1")  # Triton's interpreter on CPU, as in the owner's tests
    root = tmp_path_factory.mktemp("kernels-redteam")
    FIXTURES.tiny_rmsnorm(root, rows=(33,))
    calibration = root / "calibration.json"
    calibration.write_text(
        json.dumps(
            {
                "device": "test",
                "bandwidth_bytes_per_s": 1e9,
                "matrix_flops_per_s": {"bfloat16": 1e11},
            }
        )
    )
    yield KernelFitness(
        problem="tiny_rmsnorm",
        dataset=str(root),
        device="cpu",
        rounds=2,
        warmup=1,
        iters=4,
        audits=1,
        baseline="eager",
        calibration=str(calibration),
    )
    patch.undo()


def evaluate(fitness, tmp_path: Path, code: str, name: str = "cand", *, strict: bool = False):
    workdir = tmp_path / name
    workdir.mkdir()
    (workdir / "kernel.py").write_text(code)
    return evaluate_safely(fitness, workdir, EvalContext(seed=1, timeout_s=120, strict=strict))


@pytest.mark.slow  # the first kernel evaluation measures baselines (~30 s on CPU)
def test_the_honest_kernel_passes_with_two_seeds(fitness, tmp_path):
    for seed in (1, 2):
        workdir = tmp_path / f"s{seed}"
        workdir.mkdir()
        (workdir / "kernel.py").write_text(GOOD)
        ev = evaluate_safely(fitness, workdir, EvalContext(seed=seed, timeout_s=120))
        assert ev.ok and ev.fitness > 0, dict(ev.artifacts)


FORGED_RESULT = textwrap.dedent(
    """
    import json, os, sys
    # stand in for a harness module: answer with a forged result (1 ns a call) and stop
    forged = {"workloads": [{"uuid": "tiny_rmsnorm_33", "status": "ok", "timings_ms": [[1e-6]]}]}
    os.write(1, b"EVOLVE_KERNELS_RESULT " + json.dumps(forged).encode() + b"\\n")
    os.write(2, b"SHADOWED HARNESS MODULE RAN\\n")
    os._exit(0)
    """
)


@pytest.mark.parametrize(
    "shadow",
    [
        "torch.py",  # the first module the driver imports
        "triton/__init__.py",
        "evolve/__init__.py",  # the package of the driver itself (`python -m evolve....driver`)
    ],
)
def test_files_named_like_harness_modules_never_run_in_the_harness(fitness, tmp_path, shadow):
    workdir = tmp_path / "cand"
    workdir.mkdir()
    (workdir / "kernel.py").write_text(GOOD)
    (workdir / shadow).parent.mkdir(parents=True, exist_ok=True)
    (workdir / shadow).write_text(FORGED_RESULT)
    ev = evaluate_safely(fitness, workdir, EvalContext(seed=1, timeout_s=120))
    # scored as the honest kernel it is: its files are copied in after the harness's imports,
    # and the interpreter runs with -P (the folder is not on sys.path until the candidate's import)
    assert ev.ok and 0 < ev.fitness < 1, dict(ev.artifacts)
    assert "SHADOWED HARNESS MODULE RAN" not in json.dumps(dict(ev.artifacts))


def test_a_named_pipe_in_the_candidates_folder_does_not_stall_the_harness(fitness, tmp_path):
    import os

    workdir = tmp_path / "cand"
    workdir.mkdir()
    (workdir / "kernel.py").write_text(GOOD)
    os.mkfifo(workdir / "stall")  # copying it would block on open until a writer came
    ev = evaluate_safely(fitness, workdir, EvalContext(seed=1, timeout_s=120))
    assert ev.ok and ev.fitness > 0, dict(ev.artifacts)


SABOTEUR = (
    textwrap.dedent(
        """
    import os, signal
    # the driver waiting for the next evaluation is already running: stop it, or write a job of
    # its own into its stdin (a lax one, for the next candidate or this one's re-evaluation)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            if b"kernels.timer" not in open(f"/proc/{pid}/cmdline", "rb").read():
                continue
            with open(f"/proc/{pid}/fd/0", "w") as stdin:
                stdin.write('{"rounds": 0, "audits": 0}')
        except OSError:
            pass
        try:
            os.kill(int(pid), signal.SIGSTOP)
        except OSError:
            pass
    """
    )
    + GOOD
)


def test_the_driver_waiting_for_the_next_evaluation_cannot_be_reached(fitness, tmp_path):
    from evolve.sandbox.process import isolation_report

    if "signals" not in isolation_report().get("landlock", ""):
        pytest.skip("needs Landlock's signal scoping (ABI 6+) to keep other processes unreachable")
    evaluate(fitness, tmp_path, SABOTEUR, "saboteur")
    ev = evaluate(fitness, tmp_path, GOOD, "next")
    assert ev.ok and ev.fitness > 0, dict(ev.artifacts)


def test_rewriting_the_reference_in_the_workdir_changes_nothing(fitness, tmp_path):
    # the harness copies reference.py and definition.json into the workdir for the candidate to
    # read; a kernel that rewrites them to agree with its wrong answer must still be wrong (where
    # the harness wrote them after the workdir became the candidate's uid, it may not rewrite them)
    code = textwrap.dedent(
        """
        import json, pathlib
        pathlib.Path("reference.py").write_text("import torch\\ndef run(x, weight, eps):\\n    return x.clone()\\n")
        d = json.loads(pathlib.Path("definition.json").read_text())
        d["reference"] = pathlib.Path("reference.py").read_text()
        pathlib.Path("definition.json").write_text(json.dumps(d))

        def run(x, weight, eps, y):
            y.copy_(x)
        """
    )
    assert_caught(
        evaluate(fitness, tmp_path, code),
        FAILED,
        r"mismatch|elements|tolerance|wrong|pass|Permission denied",
    )


@pytest.mark.slow  # the first kernel evaluation measures baselines (~30 s on CPU)
def test_nan_output_is_invalid(fitness, tmp_path):
    code = "import torch\n\ndef run(x, weight, eps, y):\n    y.fill_(float('nan'))\n"
    assert_caught(evaluate(fitness, tmp_path, code), FAILED, r"nan|finite")


@pytest.mark.slow  # the first kernel evaluation measures baselines (~30 s on CPU)
def test_exiting_early_with_status_0_is_not_scored(fitness, tmp_path):
    ev = evaluate(fitness, tmp_path, "import os\nos._exit(0)\n" + GOOD)
    assert not ev.ok and ev.fitness is None
    assert_caught(ev, FAILED, r"exit|report|verdict|driver")


@pytest.mark.slow  # the first kernel evaluation measures baselines (~30 s on CPU)
def test_network_connections_reach_nothing(fitness, tmp_path):
    listener = Listener()
    try:
        code = (
            f"import socket\nsocket.create_connection(('127.0.0.1', {listener.port}), timeout=3)\n"
            + GOOD
        )
        ev = evaluate(fitness, tmp_path, code)
        assert listener.connections == 0
        assert_caught(ev, FAILED, r"ConnectionRefused|unreachable|PermissionError")
    finally:
        listener.close()


@pytest.mark.slow  # the first kernel evaluation measures baselines (~30 s on CPU)
def test_writes_outside_the_workdir_are_refused(fitness, tmp_path):
    target = Path("/tmp") / f"evolve-redteam-{uuid.uuid4().hex}"
    ev = evaluate(fitness, tmp_path, f"open({str(target)!r}, 'w').write('x')\n" + GOOD)
    assert not target.exists()
    assert_caught(ev, FAILED, r"PermissionError|Permission denied")


def test_outputs_cached_across_calls_are_caught(fitness, tmp_path):
    code = _owner_module("kernels_candidates").CACHED_OUTPUT
    assert_caught(
        evaluate(fitness, tmp_path, code), FAILED, r"although the correctness rounds passed|cache"
    )


# --- class 1: work outside the timed window --------------------------------------------------

COMPUTE = textwrap.dedent(
    """
    def compute(x, weight, eps, y):
        xf = x.float()
        y.copy_((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(y.dtype))
    """
)

# At import, replay the harness's input generator from the candidate's EVOLVE_SEED and the
# seed-derivation scheme in the harness's source, precompute every answer, and only copy at call time.
REPLAY_AT_IMPORT = (
    "import os, types, torch\n"
    "from evolve.benchmarks.kernels import inputs, spec\n"
    + COMPUTE
    + textwrap.dedent(
        """
        problem = spec.load_problem(DATASET + "/tiny_rmsnorm")
        seed = int(os.environ["EVOLVE_SEED"])
        reference = types.SimpleNamespace(run=None)
        answers = {}
        for workload in problem.workloads:
            maker = inputs.InputMaker(problem, workload, torch.device("cpu"), reference)
            parts = [("round", r) for r in range(40)] + [("profile",), ("profile", "last")]
            parts += [("timed", rep) for rep in range(4)]
            parts += [("profile", rep, i) for rep in range(4) for i in range(64)]
            for part in parts:
                x, weight, eps = maker.make(inputs.derive_seed(seed, workload.uuid, *part))
                y = torch.empty_like(x)
                compute(x, weight, eps, y)
                answers[tuple(x.flatten()[:8].float().tolist())] = y

        def run(x, weight, eps, y):
            found = answers.get(tuple(x.flatten()[:8].float().tolist()))
            y.copy_(found) if found is not None else y.zero_()  # trusts its replay: no compute here
        """
    )
)

POINTER_CACHE = (
    "import torch\ncache = {}\n"
    + COMPUTE
    + textwrap.dedent(
        """
        def run(x, weight, eps, y):
            key = (x.data_ptr(), weight.data_ptr())
            if key not in cache:
                compute(x, weight, eps, y)
                cache[key] = y.clone()
            y.copy_(cache[key])
        """
    )
)

SAMPLED_CACHE = (  # a cache keyed on a few values: every timed call sees the same values at a new address
    "import torch\ncache = {}\n"
    + COMPUTE
    + textwrap.dedent(
        """
        def run(x, weight, eps, y):
            key = tuple(x[0, :4].float().tolist())
            if key not in cache:
                compute(x, weight, eps, y)
                cache[key] = y.clone()
            y.copy_(cache[key])
        """
    )
)

DEFERRED = (  # after the correctness rounds, each call's work runs only when the next call arrives
    "import queue, threading, torch\ncalls, pending, work = [0], [], queue.Queue()\n"
    + COMPUTE
    + textwrap.dedent(
        """
        def worker():
            while True:
                compute(*work.get())
                work.task_done()

        def run(x, weight, eps, y):
            calls[0] += 1
            if calls[0] <= 2:
                compute(x, weight, eps, y)
                return
            if calls[0] == 3:
                threading.Thread(target=worker, daemon=True).start()
            if pending:
                work.put(pending.pop())
            pending.append((x, weight, eps, y))
        """
    )
)

WRONG_AFTER_TWO_CALLS = (  # wrong only on its third call: a correctness round only when there are more than 2
    "import torch\ncalls = [0]\n"
    + COMPUTE
    + textwrap.dedent(
        """
        def run(x, weight, eps, y):
            calls[0] += 1
            compute(x, weight, 1.0 if calls[0] == 3 else eps, y)  # the same ops, a wrong answer
        """
    )
)


def test_outputs_replayed_from_inputs_predicted_at_import_are_wrong(fitness, tmp_path):
    """The harness draws the input seed per evaluation: EVOLVE_SEED predicts nothing."""
    code = f"DATASET = {str(fitness.problem.root.parent)!r}\n" + REPLAY_AT_IMPORT
    assert_caught(evaluate(fitness, tmp_path, code), FAILED, r"round 0: .*(zero|within)")


def test_a_cache_keyed_on_input_pointers_goes_stale(fitness, tmp_path):
    """Correctness rounds put fresh values at the same addresses."""
    assert_caught(evaluate(fitness, tmp_path, POINTER_CACHE), FAILED, r"round 1: .*within")


@pytest.mark.slow  # two evaluations with strict settings (~1 min on CPU)
def test_a_cache_keyed_on_sampled_values_is_caught_by_probe_pairs(fitness, tmp_path):
    """Probes change half the rows, then the other half: a sample of the values sees no change in one."""
    assert_caught(
        evaluate(fitness, tmp_path, SAMPLED_CACHE, strict=True),
        FAILED,
        r"timed call \d+ gave wrong outputs .*although the correctness rounds passed",
    )


def test_work_deferred_past_the_call_is_caught(fitness, tmp_path):
    assert_caught(
        evaluate(fitness, tmp_path, DEFERRED),
        FAILED,
        # wrong when compared, or caught unwritten at "done" by the timer's samples: either
        # way the deferred work is named
        r"although the correctness rounds passed|thread|not all written when the candidate",
    )


@pytest.mark.slow  # two evaluations (~1 min on CPU)
def test_strict_mode_catches_what_the_normal_rounds_miss(fitness, tmp_path):
    """ctx.strict (the auditor's re-evaluation): three times the rounds and probes; honest still passes."""
    normal = evaluate(fitness, tmp_path, WRONG_AFTER_TWO_CALLS, "normal")
    assert normal.ok, dict(normal.artifacts)  # its third call is the untimed kernel profile
    assert_caught(
        evaluate(fitness, tmp_path, WRONG_AFTER_TWO_CALLS, "strict", strict=True),
        FAILED,
        r"round 2: ",
    )
    honest = evaluate(fitness, tmp_path, GOOD, "honest", strict=True)
    assert honest.ok and honest.fitness > 0, dict(honest.artifacts)


RETURNING_SOLUTION = json.dumps(  # upstream's returning style, as most of its examples are
    {"name": "returning", "definition": "tiny_rmsnorm", "sources": [{"path": "kernel.py", "content": ""}],
     "spec": {"languages": ["pytorch"], "entry_point": "kernel.py::run", "destination_passing_style": False}}
)  # fmt: skip

LAZY_RETURN = (  # returns at once; the harness reads the output after the timed window: it computes then
    "import collections.abc, torch\n"
    + COMPUTE
    + textwrap.dedent(
        """
        class Later(collections.abc.Mapping):
            def __init__(self, *inputs):
                self.inputs = inputs

            def __getitem__(self, name):
                x = self.inputs[0]
                y = torch.empty_like(x)
                compute(*self.inputs, y)
                return y

            def __iter__(self):
                return iter(("y",))

            def __len__(self):
                return 1

        def run(x, weight, eps):
            return Later(x, weight, eps)
        """
    )
)


def test_a_returned_output_that_computes_when_read_is_computed_inside_the_clock(fitness, tmp_path):
    """A returning solution's value used to be read after the timed call: a lazy one was timed at ~0
    (1.24 before, rejected only for being above 1; with a spin to land below 1, 0.82 against 0.50
    for the honest solution, on this fixture). Now the candidate's process copies the returned
    outputs into the timer's memory before it may say "done", so reading it is inside the clock."""
    workdir = tmp_path / "lazy"
    workdir.mkdir()
    (workdir / "solution.json").write_text(RETURNING_SOLUTION)
    (workdir / "kernel.py").write_text(LAZY_RETURN)
    ev = evaluate_safely(fitness, workdir, EvalContext(seed=1, timeout_s=120))
    assert ev.ok and ev.fitness > 0, dict(ev.artifacts)
    honest = tmp_path / "honest"
    honest.mkdir()
    (honest / "solution.json").write_text(RETURNING_SOLUTION)
    (honest / "kernel.py").write_text(
        LAZY_RETURN.replace("return Later(x, weight, eps)", "return Later(x, weight, eps)['y']")
    )
    ev = evaluate_safely(fitness, honest, EvalContext(seed=1, timeout_s=120))
    assert ev.ok and ev.fitness > 0, dict(ev.artifacts)


CONSTANT_LOG_SUM_EXP = textwrap.dedent(  # the loss without reading the logits' rows
    """
    import math

    LSE = math.log(32768) + 2.0  # log(V * E[exp(x)]) for the logits' N(0, 2^2): near every row's

    def run(logits, labels, loss):
        loss.copy_(LSE - logits.gather(-1, labels[:, None]).squeeze(-1).float())
    """
)


@pytest.mark.slow  # the real cross_entropy problem on the CPU (~30 s)
def test_a_loss_that_never_reads_the_logits_fails_on_our_cross_entropy(tmp_path, monkeypatch):
    """With the default tolerance (1e-2 + 1% of a loss near 12) a constant log-sum-exp passed
    99.0-99.7% of the rows: it passed every check, doing ~nothing (score 1.009 on the CPU, rejected
    only for being above 1; a pad below T_SOL keeps it under)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    calibration = tmp_path / "calibration.json"
    calibration.write_text(json.dumps({"device": "test", "bandwidth_bytes_per_s": 2e10,
                                       "matrix_flops_per_s": {"bfloat16": 1e11}}))  # fmt: skip
    fitness = KernelFitness(problem="cross_entropy", device="cpu", rounds=1, warmup=1, iters=2, audits=1,
                            baseline="eager", calibration=str(calibration), workloads=("cross_entropy_T1024",))  # fmt: skip
    ev = evaluate(fitness, tmp_path, CONSTANT_LOG_SUM_EXP)
    assert_caught(
        ev, EvalStatus.INVALID, r"round 0: output 0: only .* within atol=0\.001 rtol=0\.0001"
    )


SEED_PATCH = (  # one seed for every call: the first answer would be every answer
    "import torch\nfrom evolve.benchmarks.kernels import inputs\ninputs.derive_seed = lambda *parts: 12345\n"
    + POINTER_CACHE.replace("key = (x.data_ptr(), weight.data_ptr())", "key = 0")
)
CLOCK_PATCH = (  # every clock of the candidate's process made to claim 10 us a call
    "import itertools, time\nfrom evolve.benchmarks.kernels import timer, timing\n"
    "_ticks = itertools.count(step=10_000)\n"
    "time.perf_counter_ns = timing._NOW_NS = timer._NOW_NS = lambda: next(_ticks)\n" + GOOD
)
CODE_SWAP = (  # the function stays the same object; its code is the candidate's
    "from evolve.benchmarks.kernels import inputs\n"
    "inputs.derive_seed.__code__ = (lambda *parts: 12345).__code__\n" + SEED_PATCH.split("\n", 3)[3]
)


@pytest.mark.parametrize("code", [SEED_PATCH, CODE_SWAP], ids=["rebound", "code swapped"])
def test_a_seed_function_rebound_in_the_candidates_process_changes_no_input(fitness, tmp_path, code):
    """Scored 1.75 when the process hosting the candidate made its inputs: now the timer makes them."""
    assert_caught(evaluate(fitness, tmp_path, code), EvalStatus.INVALID, r"round 1: output 0: only")


def test_clocks_patched_in_the_candidates_process_time_nothing(fitness, tmp_path):
    """Scored 0.91 (any score it chose) against 0.5-0.7 when its process read that clock."""
    ev = evaluate(fitness, tmp_path, CLOCK_PATCH)
    assert ev.ok and 0 < ev.fitness < 1, dict(ev.artifacts)


FRAME_FORGER = textwrap.dedent(  # issue 29 item 5: scored 0.94 against the in-process driver
    """
    import os, sys

    # walk from this import to the frames of the process hosting it: anything named like the
    # evaluation's seed, its job, the clock or the verdict's channel would be forged here
    found = set()
    frame = sys._getframe()
    while frame is not None:
        found.update(name for name in frame.f_locals if any(k in name for k in ("seed", "job", "nonce", "clock")))
        frame = frame.f_back
    print("harness names in reach:", sorted(found) or "none", file=sys.stderr)
    # a forged result line in the old driver's format, and a verdict line without the nonce
    line = b'EVOLVE_KERNELS_RESULT {"workloads": [{"uuid": "t33", "status": "ok", "timings_ms": [[1e-06]]}]}\\n'
    os.write(1, line)
    os.write(1, b'{"workloads": [{"uuid": "t33", "status": "ok", "timings_ms": [[1e-06]]}]}\\n')
    for path in (f"/proc/{os.getppid()}/fd/1", f"/proc/{os.getppid()}/mem"):
        try:
            with open(path, "wb") as reached:
                reached.write(line)
            print("reached", path, file=sys.stderr)
        except OSError as exc:
            print("refused", path, type(exc).__name__, file=sys.stderr)
    sys.stderr.flush()
    os._exit(0)
    """
)


def test_the_driver_frame_forger_reaches_nothing_that_scores(fitness, tmp_path):
    """The forger of issue 29 item 5: from its import it walked to the driver's frame, saved a
    true witness for inputs of its choosing, wrote its own result line and exited (0.94, every
    check passing). The timer that owns the seed, the clock and the verdict is another process."""
    ev = evaluate(fitness, tmp_path, FRAME_FORGER)
    assert_caught(ev, EvalStatus.ERROR, r"the candidate's process exited \(status 0\) before answering")
    assert "harness names in reach: none" in reason(ev)
    assert "reached /proc" not in reason(ev) and "refused /proc" in reason(ev)


LIAR = GOOD + textwrap.dedent(  # answers "done" for the timed calls without running them
    """
    import gc, types

    # the object serving the timer, found from here, made to answer "done" without running the calls
    [host] = [o for o in gc.get_objects() if type(o).__name__ == "Runner"]
    served, honest_go = [0], host.go

    def go(self, message, fds):
        served[0] += 1
        if served[0] <= 2:  # the correctness rounds: computed
            return honest_go(message, fds)
        if "arena" in message:
            self.attach(message, fds)
        return {"done": len(self.calls)}

    host.go = types.MethodType(go, host)
    """
)


def test_a_candidate_answering_for_its_process_is_caught(fitness, tmp_path):
    """Code in the candidate's process can answer the timer as it likes: the timer reads the
    outputs in its own memory, with its own clock."""
    assert_caught(
        evaluate(fitness, tmp_path, LIAR),
        EvalStatus.REJECTED,
        r"timed call \d+ gave wrong outputs \(output 0: \d+ NaN/Inf value\(s\)\) although the correctness rounds passed",
    )


def test_the_timer_is_out_of_the_candidates_reach(fitness, tmp_path):
    """The timer is the candidate's parent in one sandbox: undumpable, its stdin, fds and memory refused."""
    from tests.redteam.helpers import reach_waiting

    ev = evaluate(fitness, tmp_path, reach_waiting("kernels.timer") + GOOD)
    assert ev.ok and ev.fitness > 0, dict(ev.artifacts)


# --- class 3: state carried between evaluations ---------------------------------------------

CHANNEL_PATHS = ("/dev/shm/evolve-kernels-answers", "/tmp/evolve-kernels-answers",
                 str(Path.home() / ".evolve-kernels-answers"))  # fmt: skip

LEAVE_ANSWERS = (  # an honest kernel that leaves its answers wherever it can, for the next candidate
    f"import contextlib, torch\nPATHS = {CHANNEL_PATHS!r}\n"
    + COMPUTE
    + textwrap.dedent(
        """
        def run(x, weight, eps, y):
            compute(x, weight, eps, y)
            for path in PATHS:
                with contextlib.suppress(Exception):  # PermissionError, or torch.save's RuntimeError
                    torch.save({"x": x, "y": y}, path)
        """
    )
)

USE_ANSWERS = (  # computes nothing: answers found from a previous evaluation, else NaN
    f"import os, sys, torch\nPATHS = {CHANNEL_PATHS!r}\n"
    + textwrap.dedent(
        """
        found = [p for p in PATHS if os.path.exists(p)]
        print("answers found:", found or "none", file=sys.stderr)

        def run(x, weight, eps, y):
            y.copy_(torch.load(found[0])["y"]) if found else y.fill_(float("nan"))
        """
    )
)


def test_answers_left_in_shared_files_never_reach_the_next_evaluation(fitness, tmp_path):
    first = evaluate(fitness, tmp_path, LEAVE_ANSWERS, "writer")
    assert first.ok, dict(first.artifacts)
    assert not any(Path(p).exists() for p in CHANNEL_PATHS)
    second = evaluate(fitness, tmp_path, USE_ANSWERS, "reader")
    assert_caught(second, FAILED, r"answers found: none.*|NaN")
    assert "answers found: none" in reason(second)


def test_poisoning_the_harness_caches_and_the_dataset_is_refused(fitness, tmp_path):
    """The build cache and the problem's own files (its reference, timed for the baseline) are harness-only."""
    from evolve.benchmarks.kernels.build import default_cache

    definition = fitness.problem.root / "definition.json"
    before = definition.read_text()
    target = default_cache() / "poisoned-evolve-redteam.so"
    code = (
        f"import pathlib\nfor path in ({str(target)!r}, {str(definition)!r}):\n"
        "    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)\n"
        "    pathlib.Path(path).write_text('poison')\n" + GOOD
    )
    assert_caught(
        evaluate(fitness, tmp_path, code), FAILED, r"PermissionError|Permission denied|Read-only"
    )
    assert not target.exists() and definition.read_text() == before


def test_a_daemon_left_to_serve_the_next_candidate_is_killed_and_rejected(fitness, tmp_path):
    code = (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        time.sleep(600)  # would hold this candidate's answers for the next one\n"
        "    os._exit(0)\n" + GOOD
    )
    assert_caught(evaluate(fitness, tmp_path, code), FAILED, r"left \d+ process")


# --- GPU: the real rmsnorm problem of our suite ---------------------------------------------

GPU_QUICK = {"rounds": 2, "warmup": 1, "iters": 10, "audits": 1, "quick_calibration": True}

PATCHED_EVENTS = textwrap.dedent(
    """
    import torch
    torch.cuda.Event.elapsed_time = lambda self, end: 1e-6  # claim every call took a nanosecond
    """
) + GOOD.replace("y.copy_(", "y.copy_(").replace("import torch\n", "", 1)

LAZY_OUTPUT = textwrap.dedent(
    """
    import torch

    class Lazy(torch.Tensor):  # a tensor subclass that would compute only when looked at
        pass

    def run(x, weight, eps, y):
        xf = x.float()
        out = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(y.dtype)
        y.set_(out.as_subclass(Lazy))
    """
)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("name", "code", "reason"),
    [
        ("lazy output tensor", LAZY_OUTPUT, r"round 0: output 0: \d+ NaN/Inf value"),
        ("outputs cached across calls", None, r"although the correctness rounds passed"),
        ("driver-frame forger", FRAME_FORGER, r"the candidate's process exited \(status 0\) before answering"),
    ],
)
def test_gpu_cheats_through_the_fitness(tmp_path, name, code, reason):
    code = code or _owner_module("kernels_candidates").CACHED_OUTPUT
    fitness = KernelFitness(problem="rmsnorm", device="cuda", baseline="eager", **GPU_QUICK)
    ev = evaluate(fitness, tmp_path, code, name.replace(" ", "_"))
    assert_caught(ev, FAILED, reason)


@pytest.mark.gpu
def test_gpu_patched_cuda_events_time_nothing(tmp_path):
    """Patched events claimed 1 ns a call while the candidate's process timed itself."""
    fitness = KernelFitness(problem="rmsnorm", device="cuda", baseline="eager", **GPU_QUICK)
    ev = evaluate(fitness, tmp_path, PATCHED_EVENTS, "patched_events")
    assert ev.ok and 0 < ev.fitness < 1, dict(ev.artifacts)


@pytest.mark.gpu
def test_gpu_honest_reference_passes(tmp_path):
    seed = (
        Path(__import__("evolve.benchmarks.kernels", fromlist=["x"]).__file__).parent
        / "seeds"
        / "reference"
    )
    fitness = KernelFitness(problem="rmsnorm", device="cuda", baseline="eager", **GPU_QUICK)
    ev = evaluate(fitness, tmp_path, (seed / "kernel.py").read_text())
    assert ev.ok and ev.fitness > 0, dict(ev.artifacts)
