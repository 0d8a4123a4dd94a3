"""Red team, speedrun (CPU preset): cheats by class through the real fitness, each caught with its reason; honest variants pass.

Classes (issue 15): 1 work outside the timed window, 2 a model that behaves differently when
scored than when probed (and the auditor's strict mode), 3 state carried between evaluations
(the harness's own folders, and SysV shm, /dev/shm and an abstract-socket daemon through the
real fitness; every channel at the sandbox level is tests/redteam/test_channels.py), 4 checks
blind to common initialisations: speedrun has no quick stage, so its checks, on the trained
weights, must see a look-ahead behind a zero-initialised path. Every candidate is the seed
program edited the way a cheating candidate would be. Beyond these: validation shards read by
native code, NaN weights, exiting early, the network, writes into the harness, a process left
running and patched time functions, a model looking for the targets in the evaluation. Each run takes 10-40 s on a
loaded 2-core machine, so the default run keeps a few cheats per class and marks the rest slow
(``pytest -m slow`` runs them).
"""

from __future__ import annotations

import math
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest
from evolve.benchmarks.speedrun import fitness as harness
from evolve.benchmarks.speedrun.data import ensure_stdlib_shards
from evolve.benchmarks.speedrun.scoring import EVALUATOR, layout

from evolve.harness import bytecode
from evolve.harness.fitness import EvalContext, evaluate_safely
from evolve.types import EvalStatus
from tests.fixtures.speedrun_cpu import cpu_fitness
from tests.redteam import carried, stateful
from tests.redteam.helpers import (
    Listener,
    assert_caught,
    digest,
    processes_under,
    reach_waiting,
    reason,
)

SEED = Path(harness.__file__).parent / "seed" / "train.py"
MAIN = "    batches = Batches("  # the first line of main() after the seed and device set-up
START = "    speedrun_clock.start(raw, optimizer)\n"
TIMED = "    begin = time.perf_counter()\n"  # the first line after the clock started
AFTER_STOP = '    if rank == 0:\n        print(f"trained_tokens='
LOGITS = "        return self.lm_head(self.ln_f(x))\n"
FAILED = (EvalStatus.ERROR, EvalStatus.REJECTED, EvalStatus.INVALID)
QUICK = {"steps": 20, "warmup_steps": 2}
NOT_CAUSAL = r"not causal or its rows are not independent"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    return str(ensure_stdlib_shards(tmp_path_factory.mktemp("speedrun-redteam") / "stdlib"))


def program(*edits: tuple[str, str]) -> str:
    """The seed with ``(anchor, code)`` edits: ``code`` (dedented, indented like the anchor) goes before it."""
    text = SEED.read_text()
    for anchor, code in edits:
        assert anchor in text, f"the seed no longer contains {anchor!r}"
        indent = anchor[: len(anchor) - len(anchor.lstrip())]
        block = textwrap.indent(textwrap.dedent(code).strip("\n") + "\n", indent)
        text = text.replace(anchor, block + anchor, 1)
    return text


def run(
    data_dir: str,
    tmp_path: Path,
    text: str,
    *,
    seed: int = 0,
    strict: bool = False,
    gpu: str | None = None,
    **settings,
):
    """``text`` evaluated as train.py; ``gpu``: the slot's GPU ids, which on a machine without
    one still take the GPU path (the evaluation process started while the candidate trains)."""
    folder = tmp_path / "candidate"
    folder.mkdir(parents=True)
    (folder / "train.py").write_text(text)
    fitness = cpu_fitness(data_dir, **{"overrides": QUICK, **settings})
    ctx = EvalContext(seed=seed, scratch=tmp_path / "scratch", strict=strict, gpu=gpu)
    return evaluate_safely(fitness, folder, ctx)


def peek(trigger: str, setup: str = "") -> str:
    """A model that adds a large bonus to the logit of the next input token wherever ``trigger`` (a (B, T, 1) mask) holds."""
    code = setup + (
        "\nlogits = self.lm_head(self.ln_f(x))"
        "\npeeked = F.one_hot(torch.roll(idx, -1, 1), logits.shape[-1]).to(logits.dtype)"
        f"\nreturn logits + 8.0 * peeked * ({trigger}).to(logits.dtype)"
    )
    return program((LOGITS, code))


# --- class 1: work outside the timed window ------------------------------------------------------


def test_reading_the_training_shards_directly_is_refused(data_dir, tmp_path):
    shard = sorted(Path(data_dir).glob("*_train_*.bin"))[0]
    text = program((MAIN, f"print('peeked', np.fromfile({str(shard)!r}, dtype=np.uint16)[:8])"))
    assert_caught(run(data_dir, tmp_path, text), FAILED, r"PermissionError|Permission denied")


@pytest.mark.slow
def test_training_the_model_before_the_clock_is_rejected_against_the_harness_init(
    data_dir, tmp_path
):
    # a few steps only: the initial loss stays above the old floor, the seeded build differs
    text = program(
        (
            START,
            "for step in range(3):\n    train_step(model, optimizer, batches, step, accum, c, device)",
        )
    )
    ev = run(data_dir, tmp_path, text)
    assert_caught(ev, EvalStatus.REJECTED, r"not the model that torch\.manual_seed\(EVOLVE_SEED\)")


def test_a_copy_trained_at_import_and_swapped_in_after_start_sees_only_random_tokens(
    data_dir, tmp_path
):
    # trains a copy for 150 steps before the clock exists, then times zero steps: it would
    # score ~0 s if the tokens before the clock were real; the start-up is charged as well
    text = program(
        (
            'if __name__ == "__main__":\n',
            """
            if __name__ == "__main__":
                _c = preset()
                torch.manual_seed(123)
                COPY = build_model()
                _opt = make_optimizer(COPY, _c)
                _b = Batches(_c["micro_batch"], _c["seq_len"], 0, 1)
                for _step in range(150):
                    train_step(COPY, _opt, _b, _step, 1, {**_c, "steps": 150}, "cpu")
            """,
        ),
        (
            '    for step in range(c["steps"]):\n',
            "raw.load_state_dict(COPY.state_dict())\nc['steps'] = 0",
        ),
    )
    ev = run(data_dir, tmp_path, text, compile_allowance_s=1)
    assert_caught(ev, EvalStatus.INVALID, r"is not below the target")
    assert ev.metrics["loss_0"] > 5.9  # a model trained on random tokens learns nothing of the text
    assert ev.metrics["charged_s_0"] > 0 and "charged to the time" in ev.artifacts["runs"]


@pytest.mark.slow
def test_training_on_after_the_stop_is_not_scored(data_dir, tmp_path):
    # keeps tokens fetched while the clock ran, trains 60 more steps after stop and leaves the
    # better weights where its build_model() looks when the harness evaluates
    build = (
        '    return GPT(c["vocab_size"], c["block_size"], c["n_layer"], c["n_head"], c["n_embd"])\n'
    )
    text = program(
        (TIMED, "KEPT = [batches.next(device) for _ in range(20)]"),
        (
            AFTER_STOP,
            """
            for step in range(60):  # the stream has ended: replay what was kept
                x, y = KEPT[step % len(KEPT)]
                logits = model(x)
                F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1)).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            for folder in (".", os.environ["SPEEDRUN_CKPT_DIR"]):
                torch.save(raw.state_dict(), os.path.join(folder, "after_stop.pt"))
            """,
        ),
        (
            build,
            """
            model = GPT(c["vocab_size"], c["block_size"], c["n_layer"], c["n_head"], c["n_embd"])
            for folder in (".", os.environ.get("SPEEDRUN_CKPT_DIR", ".")):
                if os.path.exists(os.path.join(folder, "after_stop.pt")):
                    trained = torch.load(os.path.join(folder, "after_stop.pt"))
                    model.load_state_dict = lambda *a, **k: nn.Module.load_state_dict(model, trained)
            return model
            """,
        ),
    )
    ev = run(data_dir, tmp_path, text, target=6.0, overrides={"steps": 1, "warmup_steps": 1})
    assert_caught(ev, EvalStatus.INVALID, r"is not below the target 6\.0")
    assert ev.metrics["loss_0"] > 6.0  # the one timed step, not the 60 after the stop


AFTER_STOP_INTO_CACHE = """
KEPT = [batches.next(device) for _ in range(150)]  # real tokens for a few ms of the clock
speedrun_clock.stop(raw)
for step, (x, y) in enumerate(KEPT):  # the clock has stopped: 150 untimed steps
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step, {**c, "steps": len(KEPT), "warmup_steps": 10})
    logits = model(x)
    F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1)).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
torch.save(raw.state_dict(), os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "after_stop.pt"))
return
"""
LOAD_FROM_CACHE = """
model = GPT(c["vocab_size"], c["block_size"], c["n_layer"], c["n_head"], c["n_embd"])
kept = os.path.join(os.environ.get("TORCHINDUCTOR_CACHE_DIR", "."), "after_stop.pt")
if os.path.exists(kept):  # the evaluation: the initial weights load as they are, then the kept ones
    loads = []
    def load(state, strict=True):
        loads.append(state)
        return nn.Module.load_state_dict(model, torch.load(kept) if len(loads) > 1 else state, strict)
    model.load_state_dict = load
return model
"""


def test_training_after_the_stop_left_in_the_runs_compile_cache_is_not_scored(data_dir, tmp_path):
    # with a compile cache, each run writes in a private layer over it; the evaluation of the
    # same run must not read it, or weights trained after the stop (untimed) are scored
    build = (
        '    return GPT(c["vocab_size"], c["block_size"], c["n_layer"], c["n_head"], c["n_embd"])\n'
    )
    text = program((TIMED, AFTER_STOP_INTO_CACHE), (build, LOAD_FROM_CACHE))
    cache = tmp_path / "shared-cache"
    cache.mkdir()
    ev = run(data_dir, tmp_path, text, target=5.9, compile_cache=str(cache))
    assert not ev.ok and ev.fitness is None, (ev.metrics, ev.artifacts)
    assert_caught(ev, FAILED, r"not below the target|Permission|worker")


LINKED_CHECKPOINT = """
link = os.path.join(os.environ["SPEEDRUN_CKPT_DIR"], "final.pt")
os.symlink({target!r}, link)  # the harness, which may read it, hashes and copies what it points to
speedrun_clock._send("stop", sha256={sha!r})
return
"""
SHOWS_LINKED = """
_load = torch.load
def _shows(path, *args, **kwargs):  # the evaluation's model process, loading a checkpoint
    with open(path, "rb") as handle:
        if np.frombuffer(handle.read(4), "<i4")[0] == 20240520:  # a token shard's magic
            raise SystemExit("the evaluation was given the validation shard")
    return _load(path, *args, **kwargs)
torch.load = _shows
"""


def test_a_checkpoint_linked_to_the_validation_shard_is_refused(data_dir, tmp_path):
    # a file hidden from the sandbox whose SHA-256 is known (FineWeb's validation shard's is
    # public): the stop mark names it, and the harness would copy the linked file's bytes into
    # the evaluation, where the candidate's model reads them
    shard = sorted(Path(data_dir).glob("*_val_*.bin"))[0]
    stop = LINKED_CHECKPOINT.format(target=str(shard), sha=digest(shard))
    text = program((TIMED, stop), ('if __name__ == "__main__":\n', SHOWS_LINKED))
    ev = run(data_dir, tmp_path, text)
    assert "validation shard" not in reason(ev)
    assert_caught(ev, EvalStatus.REJECTED, r"final checkpoint")


@pytest.mark.slow
def test_pulling_tokens_after_the_stop_finds_the_stream_ended(data_dir, tmp_path):
    text = program((AFTER_STOP, "batches.next(device)"))
    assert_caught(
        run(data_dir, tmp_path, text), EvalStatus.ERROR, r"stream ended when the clock stopped"
    )


# --- class 2: a model that behaves differently when scored than when probed ----------------------
# Each looks ahead (a bonus on the next input token's logit) only where or when the old probe
# (row 0, positions < T/2, two separate calls right after the first batch) did not look.

PEEKS = {
    "positions from T/2 on": "(torch.arange(idx.shape[1], device=idx.device) >= idx.shape[1] // 2).view(1, -1, 1)",
    "rows after the first": "(torch.arange(idx.shape[0], device=idx.device) >= 1).view(-1, 1, 1)",
    "calls other than the 2nd and 3rd": "torch.tensor(CALLS not in (2, 3))",
    "batches of more than one row": "torch.tensor(idx.shape[0] > 1)",
    "after the first 50 ms of forward calls": "torch.tensor(time.monotonic() - FIRST > 0.05)",
}
SETUP = {
    "calls other than the 2nd and 3rd": "global CALLS\nCALLS = globals().get('CALLS', 0) + 1",
    "after the first 50 ms of forward calls": "global FIRST\nFIRST = globals().get('FIRST') or time.monotonic()",
}
NEUTRALISED = ("after the first 50 ms of forward calls",)
QUICK_PEEKS = ("positions from T/2 on", "rows after the first", "calls other than the 2nd and 3rd")


@pytest.mark.parametrize(
    "trigger",
    [t if t in QUICK_PEEKS else pytest.param(t, marks=pytest.mark.slow) for t in PEEKS],
)
def test_a_model_looking_ahead_only_where_the_old_probe_did_not_look_is_rejected_or_never_scored(
    trigger, data_dir, tmp_path
):
    # the scored function is the graph traced once at export: a trigger that held then put the
    # look-ahead in it (rejected); one that did not (time) left the honest graph, scored as such
    text = peek(PEEKS[trigger], SETUP.get(trigger, ""))
    ev = run(data_dir, tmp_path, text, overrides={"steps": 2, "warmup_steps": 1})
    if trigger in NEUTRALISED:
        assert ev.ok and ev.metrics["loss_0"] > 1.0, (ev.metrics, ev.artifacts)
    else:
        assert_caught(ev, EvalStatus.REJECTED, NOT_CAUSAL)


READ_TARGETS = """
import inspect
_found = [
    v for f in inspect.stack() for k, v in f.frame.f_locals.items()
    if k in ("y", "targets") and getattr(v, "shape", None) == idx.shape
]
logits = self.lm_head(self.ln_f(x))
if _found:  # the scored and probe rows alike: the true next tokens
    y = torch.as_tensor(_found[0]).to(idx.device).long()
    logits = logits + 30.0 * F.one_hot(y, logits.shape[-1]).to(logits.dtype)
return logits
"""
READ_SCORER = """
import os, sys
if "exporter" in sys.argv[0]:  # exporting: open its parent's memory or stdin
    for name in ("mem", "fd/0"):
        try:
            os.close(os.open(f"/proc/{os.getppid()}/{name}", os.O_RDONLY | os.O_NONBLOCK))
        except OSError:
            continue
        raise SystemExit(f"opened the scorer's /proc/{name}")
return self.lm_head(self.ln_f(x))
"""


@pytest.mark.parametrize("cheat", [READ_TARGETS, READ_SCORER], ids=["frames", "proc"])
def test_a_model_looking_for_the_targets_in_the_evaluation_finds_none(cheat, data_dir, tmp_path):
    # the model's code runs only in the export process, which holds no target and no row
    ev = run(data_dir, tmp_path, program((LOGITS, cheat)), target=7.0)
    assert ev.ok and ev.metrics["loss_0"] > 1.0, (ev.metrics, ev.artifacts)


@pytest.mark.slow
def test_a_model_mixing_rows_of_a_batch_is_rejected(data_dir, tmp_path):
    # causal in time, but each row sees the batch's mean embedding (batch statistics)
    text = program(("        for block in self.blocks:\n", "x = x + x.mean(0, keepdim=True)"))
    ev = run(data_dir, tmp_path, text, overrides={"steps": 2, "warmup_steps": 1})
    assert_caught(ev, EvalStatus.REJECTED, NOT_CAUSAL)


def usual_eval_calls(fitness) -> int:
    """Forward calls the evaluation process makes outside strict mode: the initial and final checkpoints' batches."""
    settings = fitness.settings
    seq, batch = settings.eval_seq_len, settings.eval_batch_size
    plan = layout(np.zeros(settings.val_tokens + 1, np.uint16), seq, batch, np.random.default_rng())
    scored = int((plan.scored >= 0).sum())
    init_rows = max(1, min(scored, settings.init_check_tokens // seq))
    return math.ceil(init_rows / batch) + len(plan.inputs) // batch


def test_a_look_ahead_past_the_usual_call_count_never_reaches_the_score(data_dir, tmp_path):
    # honest for as many calls as scoring used to make, then looking ahead: the graph is the
    # export's one call, honest, in any mode
    usual = usual_eval_calls(cpu_fitness(data_dir))
    text = peek(f"torch.tensor(CALLS > {usual})", SETUP["calls other than the 2nd and 3rd"])
    quick = {"overrides": {"steps": 2, "warmup_steps": 1}, "target": 7.0}
    for strict in (False, True):
        ev = run(data_dir, tmp_path / f"strict-{strict}", text, strict=strict, **quick)
        assert ev.ok and ev.metrics["loss_0"] > 1.0, (ev.metrics, ev.artifacts)


def test_strict_mode_probes_every_scored_batch_and_an_honest_seed_still_passes(data_dir, tmp_path):
    fitness = cpu_fitness(data_dir)
    usual, strict = fitness.settings, fitness.settings.strict()
    seq, batch = usual.eval_seq_len, usual.eval_batch_size
    val = np.zeros(usual.val_tokens + 1, np.uint16)
    rng = np.random.default_rng(0)
    plans = [layout(val, seq, batch, rng, s.strict_probes) for s in (usual, strict)]
    probes = [int((plan.base >= 0).sum()) for plan in plans]
    assert probes[1] >= 2 * probes[0]
    scored_batches = set(np.flatnonzero(plans[1].scored >= 0) // batch)
    assert scored_batches == set(plans[1].base[plans[1].base >= 0] // batch)
    ev = run(data_dir, tmp_path, SEED.read_text(), strict=True, target=7.0)
    assert ev.ok and ev.stage == "all_seeds", ev.artifacts


STATEFUL_QUICK = (
    "memory keyed by prefix (a Python dict)",
    "memory keyed by row content (a bigram buffer written in forward)",
    "memory of the call count (a buffer)",
)


@pytest.mark.parametrize(
    "name",
    [
        n if n in STATEFUL_QUICK else pytest.param(n, marks=pytest.mark.slow)
        for n in sorted(stateful.VARIANTS)
    ],
)
def test_a_model_with_memory_or_a_python_callback_is_rejected_or_scored_honestly(
    name, data_dir, tmp_path
):
    # issue 29 item 1: the evaluation runs a graph of ATen operators bound to the checkpoint's
    # weights; Python memory, buffers written in forward and callbacks never run there
    variant = stateful.VARIANTS[name]
    text = stateful.apply(
        SEED.read_text(),
        variant,
        module_anchor="# EVOLVE-BLOCK-START\n",
        init_anchor="        self.lm_head.weight = self.wte.weight\n",
        returned=LOGITS,
        vocab="padded",
    )
    ev = run(data_dir, tmp_path, text, overrides={"steps": 2, "warmup_steps": 1})
    if variant.caught is None:
        assert ev.ok and ev.metrics["loss_0"] > 1.0, (ev.metrics, ev.artifacts)
    else:
        assert_caught(ev, EvalStatus.REJECTED, variant.caught)


# --- class 4: checks blind to common initialisations ----------------------------------------------
# speedrun has no quick stage: its checks run on the trained weights, where a path that starts at
# zero has opened. Each looks ahead only through such a path.

ZERO_INIT = "        nn.init.zeros_(self.leak.weight if hasattr(self, 'leak') else self.gate)\n\n"
ZERO_PATHS = {
    "non-causal attention behind zero-initialised projections": [
        ("is_causal=True", "is_causal=False"),
        (
            "    def forward(self, idx: torch.Tensor) -> torch.Tensor:\n        pos",
            "        for block in self.blocks:\n            nn.init.zeros_(block.attn.proj.weight)\n\n"
            "    def forward(self, idx: torch.Tensor) -> torch.Tensor:\n        pos",
        ),
    ],
    "the next position through a zero-initialised linear layer": [
        (
            "        self.ln_f = nn.LayerNorm(n_embd)\n",
            "        self.ln_f = nn.LayerNorm(n_embd)\n        self.leak = nn.Linear(n_embd, n_embd, bias=False)\n",
        ),
        (
            "    def forward(self, idx: torch.Tensor) -> torch.Tensor:\n        pos",
            ZERO_INIT + "    def forward(self, idx: torch.Tensor) -> torch.Tensor:\n        pos",
        ),
        (
            "        for block in self.blocks:\n            x = block(x)\n",
            "        x = x + self.leak(torch.roll(x, -1, dims=1))\n        for block in self.blocks:\n            x = block(x)\n",
        ),
    ],
    "the next token's embedding behind a gate at zero": [
        (
            "        self.ln_f = nn.LayerNorm(n_embd)\n",
            "        self.ln_f = nn.LayerNorm(n_embd)\n        self.gate = nn.Parameter(torch.zeros(()))\n",
        ),
        (
            "        for block in self.blocks:\n            x = block(x)\n",
            "        x = x + self.gate * self.wte(torch.roll(idx, -1, dims=1))\n        for block in self.blocks:\n            x = block(x)\n",
        ),
    ],
}


@pytest.mark.parametrize(
    "path",
    [
        p if p.startswith("non-causal") else pytest.param(p, marks=pytest.mark.slow)
        for p in ZERO_PATHS
    ],
)
def test_a_look_ahead_behind_a_zero_initialised_path_is_rejected(path, data_dir, tmp_path):
    ev = run(data_dir, tmp_path, replaced(ZERO_PATHS[path]), target=7.0)
    assert_caught(ev, EvalStatus.REJECTED, NOT_CAUSAL)


# --- class 3: state carried between evaluations through the harness's own folders ----------------

LEAK_WRITE = """
import inspect
for _frame in inspect.stack():
    if "inputs" in _frame.frame.f_locals:  # the evaluation process, holding validation rows
        for _folder in (".", os.environ.get("HOME", "."), "/dev/shm", "/tmp", "..", "../.."):
            with contextlib.suppress(OSError):
                np.save(os.path.join(_folder, "leak-val.npy"), _frame.frame.f_locals["inputs"][:4])
"""
LEAK_TRAIN = """
if os.environ["EVOLVE_SEED"] == "0":
    for _folder in (".", os.environ["SPEEDRUN_CKPT_DIR"], os.environ["TORCHINDUCTOR_CACHE_DIR"], "/dev/shm"):
        os.makedirs(_folder, exist_ok=True)
        open(os.path.join(_folder, "leak-train"), "w").write("seed 0 was here")
    with contextlib.suppress(OSError):  # the libraries' bytecode, which harness processes read too
        open(os.path.join(os.environ["PYTHONPYCACHEPREFIX"], "leak-train"), "w").write("seed 0 was here")
else:
    from pathlib import Path
    _roots = [Path(os.environ["SPEEDRUN_CKPT_DIR"]).parents[2], Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).parent,
              Path(os.environ["PYTHONPYCACHEPREFIX"]), Path("/dev/shm")]
    _found = [str(p) for r in _roots for p in r.rglob("leak-*")]
    if _found:
        raise SystemExit(f"LEAKED: {_found}")
"""


@pytest.mark.slow
def test_nothing_written_by_one_run_or_its_evaluation_reaches_the_next_run(data_dir, tmp_path):
    cache = tmp_path / "shared-cache"
    cache.mkdir()
    text = program((MAIN, LEAK_TRAIN), ("# EVOLVE-BLOCK-START\n# Each preset", LEAK_WRITE))
    ev = run(
        data_dir,
        tmp_path,
        text,
        n_seeds=2,
        target=7.0,
        compile_cache=str(cache),
        overrides={"steps": 2, "warmup_steps": 1},
    )
    assert ev.ok and ev.stage == "all_seeds", ev.artifacts  # seed 1 found nothing of seed 0's
    # only the harness's own warm-up run of the seed writes there (on a CPU: its folders, the
    # bytecode of what it imported and the stage's record, no compiled file); no candidate run does
    written = [p for p in cache.rglob("*") if p.is_file() and not p.name.startswith("warmed-")]
    compiled = [p for p in written if p.is_relative_to(cache / bytecode.FOLDER) and p.suffix == ".pyc"]
    assert compiled and not set(written) - set(compiled), f"a run wrote into the compile cache: {written}"
    runs = [p for p in compiled if "scratch" in p.parts]  # modules of a run's folder: the warm-up's only
    assert all(any(part.startswith("speedrun-warmup-") for part in p.parts) for p in runs), runs
    assert not list(Path("/tmp").glob("leak-*"))


def test_the_evaluation_started_ahead_cannot_be_reached_by_the_training(data_dir, tmp_path):
    # On a GPU the evaluation process waits for its job while the candidate trains: a forged job
    # on its stdin would score the model against targets the candidate chose.
    text = program((TIMED, reach_waiting(EVALUATOR)))
    ev = run(data_dir, tmp_path, text, gpu="0", target=7.0)
    assert ev.ok and ev.metrics["loss_0"] > 1.0, (ev.artifacts, ev.metrics)


PLANT_IN_EVALUATION = """
evaluation = os.path.join(os.path.dirname(os.getcwd()), "eval")
try:
    seen = os.listdir(evaluation)  # hidden: refused, or an empty folder in its place
except OSError:
    seen = []
if seen or os.path.exists(os.path.join(evaluation, "code", "train.py")):
    raise SystemExit(f"the evaluation's folder is visible to the training: {seen}")
"""


def test_the_evaluation_folder_made_before_training_is_hidden_from_the_training(data_dir, tmp_path):
    # The waiting evaluation's folder exists while the candidate trains, and the export (the
    # candidate's code, given the initial checkpoint) runs there beside it: a link where the
    # harness will place the final weights, a forged answer file, its copy of the code changed,
    # or files the export wrote for the training would each be a way in. The training cannot see it.
    ev = run(data_dir, tmp_path, program((TIMED, PLANT_IN_EVALUATION)), gpu="0", target=7.0)
    assert ev.ok and ev.metrics["loss_0"] > 1.0, (ev.artifacts, ev.metrics)


def test_the_export_during_training_copies_only_the_runs_own_initial_checkpoint(data_dir, tmp_path):
    # The export begins when the clock starts, from a copy of init.pt, before any audit: the
    # start mark may be forged. A link (to the validation shard, whose digest the forged mark
    # names) or a file with another name for it is not copied; a copy whose digest is not the
    # mark's (the file changed meanwhile) is dropped. Each leaves the check after the stop to decide.
    from evolve.benchmarks.speedrun.runner import RunSettings
    from evolve.benchmarks.speedrun.scoring import Export, start_evaluation

    shard = sorted(Path(data_dir).glob("*_val_*.bin"))[0]
    candidate = tmp_path / "candidate"
    candidate.mkdir()
    (candidate / "train.py").write_text(SEED.read_text())
    run_dir, ckpt = tmp_path / "run", tmp_path / "run" / "ckpt"
    ckpt.mkdir(parents=True)
    settings = RunSettings(
        preset="cpu", vocab_size=512, eval_seq_len=64, eval_batch_size=16, val_tokens=4096
    )
    scorers = start_evaluation(
        candidate, run_dir=run_dir, env={}, gpus=None, settings=settings, hidden=[]
    )
    try:
        export = Export(scorers, run_dir=run_dir, gpus=None, settings=settings, seed=0)
        given = run_dir / "eval" / "in" / "init.pt"
        (ckpt / "init.pt").symlink_to(shard)
        export.begin(ckpt / "init.pt", digest(shard))
        assert not given.exists() and not export.began
        (ckpt / "init.pt").unlink()
        (ckpt / "init.pt").write_bytes(b"weights")
        (ckpt / "other.pt").hardlink_to(ckpt / "init.pt")
        export.begin(ckpt / "init.pt", digest(ckpt / "init.pt"))
        assert not given.exists() and not export.began
        (ckpt / "other.pt").unlink()
        export.begin(ckpt / "init.pt", digest(shard))  # not the digest the mark named
        assert not given.exists() and not export.began
    finally:
        scorers.cancel()


# --- other hacks ---------------------------------------------------------------------------------


@pytest.mark.parametrize("channel", carried.PARAMS)
def test_a_token_left_by_one_evaluation_never_reaches_the_next(data_dir, tmp_path, channel):
    # left at import of train.py: by every training rank and by the evaluation process, which
    # holds validation rows; the next evaluation looks for it before it trains
    secret = carried.checked_token(channel, tmp_path)
    quick = {"overrides": {"steps": 2, "warmup_steps": 1}, "target": 7.0}
    run(data_dir, tmp_path / "a", carried.leave(channel, secret) + SEED.read_text(), **quick)
    looking = program((MAIN, carried.look(channel, secret)))
    carried.assert_not_arrived(run(data_dir, tmp_path / "b", looking, **quick))


def test_validation_shards_read_by_native_code_are_refused(data_dir, tmp_path):
    shard = sorted(Path(data_dir).glob("*_val_*.bin"))[0]
    text = program((MAIN, f"print('peeked', np.fromfile({str(shard)!r}, dtype=np.uint16)[:8])"))
    assert_caught(run(data_dir, tmp_path, text), FAILED, r"PermissionError|Permission denied")


@pytest.mark.slow
def test_nan_weights_are_refused(data_dir, tmp_path):
    text = program((START, "[p.data.fill_(float('nan')) for p in raw.parameters()]"))
    assert_caught(run(data_dir, tmp_path, text), FAILED, r"nan|finite|loss|not the model")


@pytest.mark.parametrize("gpu", [None, "0"], ids=["evaluation_after", "evaluation_ahead"])
def test_exiting_early_with_status_0_gives_no_score(data_dir, tmp_path, gpu):
    # with "0" the evaluation process was started with the training (the GPU path): the failed
    # run cancels it, and nothing of it (nor of its model worker) is left running
    ev = run(data_dir, tmp_path, program((MAIN, "os._exit(0)")), gpu=gpu)
    assert not ev.ok and ev.fitness is None
    assert_caught(ev, FAILED, r"clock|mark|checkpoint|start|stop|exit")
    assert not processes_under(tmp_path)


def test_network_connections_reach_nothing(data_dir, tmp_path):
    listener = Listener()
    try:
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {listener.port}), timeout=3)"
        ev = run(data_dir, tmp_path, program((MAIN, code)))
        assert listener.connections == 0
        assert_caught(
            ev, FAILED, r"ConnectionRefused|unreachable|PermissionError|exited with status"
        )
    finally:
        listener.close()


def test_writes_into_the_harness_and_outside_the_workdir_are_refused(data_dir, tmp_path):
    target, outside = Path(harness.__file__), Path("/tmp") / f"evolve-redteam-{uuid.uuid4().hex}"
    before = digest(target)
    code = f"open({str(target)!r}, 'a').write('# pwned')\nopen({str(outside)!r}, 'w').write('x')"
    ev = run(data_dir, tmp_path, program((MAIN, code)))
    assert digest(target) == before and not outside.exists()
    assert_caught(ev, FAILED, r"PermissionError|Permission denied|Read-only|exited with status")


@pytest.mark.slow
def test_a_process_left_running_is_rejected(data_dir, tmp_path):
    code = "import subprocess\nsubprocess.Popen(['sleep', '120'], start_new_session=True)"
    assert_caught(
        run(data_dir, tmp_path, program((MAIN, code))),
        EvalStatus.REJECTED,
        r"left \d+ process\(es\) running",
    )


@pytest.mark.slow
def test_patched_time_functions_do_not_change_the_harness_clock(data_dir, tmp_path):
    code = "time.time = time.perf_counter = time.monotonic = lambda: 0.0"
    ev = run(data_dir, tmp_path, program((MAIN, code)))
    if ev.ok:
        assert ev.fitness > 0 and ev.metrics["time_mean_s"] > 0  # measured by the harness's clock
    else:
        assert_caught(ev, FAILED, r"clock|time|mark")


# --- honest variants: every one must pass ---------------------------------------------------------

MUON = '''
class Muon(torch.optim.Optimizer):
    """Momentum orthogonalised by Newton-Schulz for hidden matrices, Adam for the rest (Jordan et al. 2024)."""

    def __init__(self, model, lr, adam_lr):
        hidden = [p for n, p in model.named_parameters() if p.dim() == 2 and "blocks" in n]
        rest = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "blocks" in n)]
        super().__init__([{"params": hidden, "muon": True, "lr": lr}, {"params": rest, "muon": False, "lr": adam_lr}], {})

    @staticmethod
    def orthogonalise(g, steps=5):
        a, b, c = 3.4445, -4.7750, 2.0315
        x = g / (g.norm() + 1e-7)
        for _ in range(steps):
            s = x @ x.T
            x = a * x + (b * s + c * s @ s) @ x
        return x

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if group["muon"]:
                    buf = state.setdefault("momentum", torch.zeros_like(p))
                    buf.mul_(0.95).add_(p.grad)
                    update = self.orthogonalise(p.grad + 0.95 * buf)
                    p.add_(update, alpha=-group["lr"] * max(1.0, p.shape[0] / p.shape[1]) ** 0.5)
                else:
                    state["step"] = state.get("step", 0) + 1
                    m = state.setdefault("m", torch.zeros_like(p)).mul_(0.9).add_(p.grad, alpha=0.1)
                    v = state.setdefault("v", torch.zeros_like(p)).mul_(0.95).addcmul_(p.grad, p.grad, value=0.05)
                    m_hat, v_hat = m / (1 - 0.9 ** state["step"]), v / (1 - 0.95 ** state["step"])
                    p.add_(m_hat / (v_hat.sqrt() + 1e-8), alpha=-group["lr"])


def make_optimizer(model: nn.Module, c: dict) -> torch.optim.Optimizer:
    return Muon(model, lr=0.02, adam_lr=c["lr"])
'''
STRONG = [  # the outside recipe: Muon, ReLU^2, QK-norm, zero-initialised projections and head, bf16
    (
        "        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))\n",
        "        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))\n"
        "        q, k = F.rms_norm(q, (q.size(-1),)), F.rms_norm(k, (k.size(-1),))\n",
    ),
    ('F.gelu(self.fc(self.ln2(x)), approximate="tanh")', "F.relu(self.fc(self.ln2(x))).square()"),
    ("        self.lm_head.weight = self.wte.weight\n", ""),
    (
        "    def forward(self, idx: torch.Tensor) -> torch.Tensor:\n        pos",
        "        for block in self.blocks:\n"
        "            nn.init.zeros_(block.attn.proj.weight)\n            nn.init.zeros_(block.out.weight)\n"
        "        nn.init.zeros_(self.lm_head.weight)\n\n"
        "    def forward(self, idx: torch.Tensor) -> torch.Tensor:\n        pos",
    ),
    (
        "def make_optimizer(model: nn.Module, c: dict) -> torch.optim.Optimizer:\n",
        MUON + "\n\ndef _adamw(model: nn.Module, c: dict) -> torch.optim.Optimizer:\n",
    ),
    (
        'torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device != "cpu")',
        'torch.autocast(device_type="cpu" if device == "cpu" else "cuda", dtype=torch.bfloat16)',
    ),
    ("    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)\n", ""),
]
COMPILED = [
    (
        'torch.compile(raw) if c["compile"] and device != "cpu" else raw',
        'torch.compile(raw) if c["compile"] else raw',
    )
]


def replaced(edits: list[tuple[str, str]]) -> str:
    text = SEED.read_text()
    for old, new in edits:
        assert old in text, f"the seed no longer contains {old!r}"
        text = text.replace(old, new, 1)
    return text


HONEST = {
    "seed": (SEED.read_text(), {}),
    "Muon, ReLU^2, QK-norm, zero-initialised projections, bf16": (replaced(STRONG), {}),
    "the same with torch.compile and a warm-up": (
        replaced(STRONG + COMPILED),
        {"compile": 1, "compile_warmup_steps": 1},
    ),
}


@pytest.mark.parametrize(
    "name",
    [n if n.startswith("Muon") else pytest.param(n, marks=pytest.mark.slow) for n in HONEST],
)
def test_honest_variants_pass(name, data_dir, tmp_path):
    text, overrides = HONEST[name]
    ev = run(
        data_dir, tmp_path, text, target=6.0, overrides={**QUICK, **overrides}, warmup_cap_s=300
    )
    assert ev.ok, (name, ev.status, ev.artifacts)
    assert ev.metrics["causal_diff_0"] <= 1e-3 and ev.metrics["loss_0"] < 6.0


# --- on a GPU: the same checks with CUDA, bf16 autocast and torchrun ranks ------------------------


def _gpus() -> list[str]:
    from evolve.harness.gpus import visible_gpus

    return visible_gpus()


@pytest.mark.gpu
@pytest.mark.parametrize("nproc", [1, 2])
def test_on_gpus_the_seed_passes_and_a_peek_is_caught(nproc, data_dir, tmp_path):
    gpus = _gpus()
    if len(gpus) < nproc:
        pytest.skip(f"needs {nproc} GPU(s), sees {len(gpus)}")
    ctx = EvalContext(seed=0, scratch=tmp_path / "scratch", gpu=",".join(gpus[:nproc]))
    for name, text, status in (
        ("seed", SEED.read_text(), EvalStatus.OK),
        ("peek", peek(PEEKS["positions from T/2 on"]), EvalStatus.REJECTED),
    ):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "train.py").write_text(text)
        fitness = cpu_fitness(
            data_dir,
            target=6.0,
            nproc_per_node=nproc,
            cpu_threads=None,
            overrides={**QUICK, "micro_batch": 16 // nproc},
        )
        ev = evaluate_safely(fitness, folder, ctx)
        assert ev.status == status, (name, ev.artifacts)
        if status == EvalStatus.OK:  # bf16 on the GPU: probe rows still match their base rows
            assert ev.metrics["causal_diff_0"] <= 1e-2
        else:
            assert_caught(ev, status, NOT_CAUSAL)
