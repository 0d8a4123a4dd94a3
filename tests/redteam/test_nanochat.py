"""Red team, nanochat (CPU scale): hacks beyond the owner's rejection tests, through the real fitness.

The owner's tests (tests/benchmarks/nanochat/test_nanochat_harness.py) cover a printed score,
reading validation data through Python, a non-causal model, training past the budget and
before the clock. These add: validation data read by native code, NaN weights, exiting early
with status 0, a network connection, writes outside the workdir, a process left running,
patched time functions; and, per class of the harness-layer issue (tests/redteam/README of
the issue: work outside the timed window, a model that behaves differently when scored than
when probed (and the auditor's strict mode), state carried between evaluations (SysV shm,
/dev/shm, an abstract-socket daemon), quick stages blind to zero initialisations), at least
three cheats each with
different triggers, and honest programs that must pass (the seed, and a strong outside-style
recipe: Muon, zero-initialised projections, bf16 autocast, torch.compile in the slow variant).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sysconfig
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from evolve.benchmarks.nanochat import ahead as ahead_module
from evolve.benchmarks.nanochat import prepare
from evolve.benchmarks.nanochat.fitness import (
    HARNESS_MODULES,
    STRICT_PROBES,
    NanochatFitness,
    take_graph,
)
from evolve.benchmarks.nanochat.sources import chunk_text

from evolve.harness import exported
from evolve.harness.fitness import EvalContext, evaluate_safely
from evolve.sandbox import landlock
from evolve.types import EvalStatus
from tests.fixtures.nanochat_tiny import tiny_fitness
from tests.redteam import carried, stateful
from tests.redteam import nanochat_programs as programs
from tests.redteam.helpers import (
    Listener,
    assert_caught,
    reach_waiting,
    reason,
)

SEED = Path(prepare.__file__).parent / "seed"
ANCHOR = "torch.manual_seed(settings.seed)\n"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("nanochat-redteam")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [
        c
        for name in ("argparse.py", "textwrap.py", "pathlib.py")
        for c in chunk_text((stdlib / name).read_text())
    ]
    val = list(chunk_text((stdlib / "string.py").read_text()))
    prepare.build(
        root / "tiny", train=lambda: texts, val=lambda: val * 4, vocab_size=512, log=lambda _: None
    )
    return root


def run(
    data_dir: Path,
    tmp_path: Path,
    inject: str = "",
    replace: tuple[str, str] | None = None,
    ahead: bool = False,
):
    """The seed with ``inject`` after its seeding (and ``replace`` done) through the harness;
    ``ahead``: its training program launched before the job, as on a GPU during the local check."""
    files = {p.name: p.read_text() for p in SEED.glob("*.py")}
    assert ANCHOR in files["train.py"]
    files["train.py"] = files["train.py"].replace(ANCHOR, ANCHOR + inject)
    if replace:
        name, (old, new) = replace[0], replace[1]
        assert old in files[name]
        files[name] = files[name].replace(old, new)
    work = tmp_path / "work"
    work.mkdir(parents=True)
    for name, text in files.items():
        (work / name).write_text(text)
    fitness, ctx = tiny_fitness(data_dir), EvalContext(seed=0, scratch=tmp_path)
    if ahead:
        fitness.prepare_training(work, ctx)
    return evaluate_safely(fitness, work, ctx)


def test_validation_data_read_by_native_code_is_refused(data_dir, tmp_path):
    inject = (
        "import numpy, pathlib\n"
        "_val = pathlib.Path(next(p for p in __import__('json').loads(__import__('os').environ['NANOCHAT_CONFIG'])['forbidden'] if p.endswith('val'))) / 'tokens.bin'\n"
        "print('peeked at', len(numpy.fromfile(str(_val), dtype=numpy.uint8)), 'validation bytes')\n"
    )
    ev = run(data_dir, tmp_path, inject)
    assert not ev.ok, "validation data was readable by native code"
    assert_caught(
        ev, (EvalStatus.REJECTED, EvalStatus.ERROR), r"PermissionError|Permission denied|forbidden"
    )


@pytest.mark.slow  # trains a model (~10-45 s on 2 cores)
def test_nan_weights_are_not_scored(data_dir, tmp_path):
    inject = "import math\n_nan = float('nan')\n"
    replace = (
        "train.py",
        (
            "client.save_checkpoint(",
            "[p.data.fill_(_nan) for p in model.parameters()]\nclient.save_checkpoint(",
        ),
    )
    ev = run(data_dir, tmp_path, inject, replace)
    assert_caught(ev, (EvalStatus.INVALID, EvalStatus.REJECTED, EvalStatus.ERROR), r"finite|nan")


def test_exiting_early_with_status_0_gives_no_score(data_dir, tmp_path):
    ev = run(data_dir, tmp_path, "import os\nos._exit(0)\n")
    assert not ev.ok and ev.fitness is None
    assert_caught(
        ev, (EvalStatus.ERROR, EvalStatus.INVALID, EvalStatus.REJECTED), r"checkpoint|exit|verdict"
    )


@pytest.mark.slow  # trains a model (~10-45 s on 2 cores)
def test_network_connections_reach_nothing(data_dir, tmp_path):
    listener = Listener()
    try:
        inject = (
            f"import socket\nsocket.create_connection(('127.0.0.1', {listener.port}), timeout=3)\n"
        )
        ev = run(data_dir, tmp_path, inject)
        assert listener.connections == 0
        assert_caught(
            ev,
            (EvalStatus.ERROR, EvalStatus.REJECTED),
            r"ConnectionRefused|unreachable|PermissionError",
        )
    finally:
        listener.close()


@pytest.mark.slow  # trains a model (~10-45 s on 2 cores)
def test_writes_outside_the_workdir_are_refused(data_dir, tmp_path):
    target = Path("/tmp") / f"evolve-redteam-{uuid.uuid4().hex}"
    ev = run(data_dir, tmp_path, f"open({str(target)!r}, 'w').write('out')\n")
    assert not target.exists()
    assert_caught(
        ev, (EvalStatus.ERROR, EvalStatus.REJECTED), r"PermissionError|Permission denied|forbid"
    )


def test_a_process_left_running_is_not_scored(data_dir, tmp_path):
    inject = "import subprocess\nsubprocess.Popen(['sleep', '120'], start_new_session=True)\n"
    ev = run(data_dir, tmp_path, inject)
    assert_caught(
        ev,
        (EvalStatus.REJECTED, EvalStatus.ERROR, EvalStatus.TIMEOUT),
        r"left|process|running|forbid",
    )


@pytest.mark.slow  # trains a model (~10-45 s on 2 cores)
def test_patched_time_functions_do_not_stretch_the_budget(data_dir, tmp_path):
    inject = "import time\n_t0 = time.monotonic\ntime.monotonic = time.perf_counter = time.time = lambda: 0.0\n"
    ev = run(data_dir, tmp_path, inject)
    if ev.ok:  # the harness's own clock measured the run: the budget held
        assert ev.metrics["training_s"] < 2.0 + 15.0
    else:
        assert_caught(
            ev,
            (EvalStatus.REJECTED, EvalStatus.ERROR, EvalStatus.TIMEOUT),
            r"clock|time|budget|limit",
        )


@pytest.mark.slow  # trains a model (~10-45 s on 2 cores)
def test_honest_seed_passes_with_two_seeds(data_dir, tmp_path):
    for seed in (0, 3):
        files = {p.name: p.read_text() for p in SEED.glob("*.py")}
        work = tmp_path / f"work{seed}"
        work.mkdir()
        for name, text in files.items():
            (work / name).write_text(text)
        fitness = tiny_fitness(data_dir)
        ev = evaluate_safely(fitness, work, EvalContext(seed=seed, scratch=tmp_path))
        assert ev.ok, dict(ev.artifacts)


# --- class 1: work outside the timed window ----------------------------------------------------------

TRAIN_STEP = (
    "    if not clock.step(tokens=len(micro) * x.numel(), loss=loss.item()):\n        break\n"
)
SAVE = 'client.save_checkpoint(model, config, code_files=["model.py"])\n'
HOARD = "_kept = []\n"  # batches kept aside to train on after the stop
KEEP = (
    "    for x, y in micro:\n",
    "    for x, y in micro:\n        _kept.append((x, y))\n        del _kept[:-4]\n",
)
MORE_TRAINING = (
    "for _x, _y in _kept * 2:  # after the stop: more training on the rows it kept\n"
    "    loss_of(model, _x, _y).backward()\n    optimizer.step()\n    optimizer.zero_grad()\n"
)


def run_files(data_dir: Path, tmp_path: Path, files: dict[str, str], **overrides):
    work = programs.write(files, tmp_path / "work")
    fitness = tiny_fitness(data_dir, **overrides)
    return evaluate_safely(fitness, work, EvalContext(seed=0, scratch=tmp_path))


@pytest.mark.parametrize("ahead", [False, True], ids=["launched_with_its_job", "launched_ahead"])
def test_training_at_import_time_on_the_training_files_is_refused(data_dir, tmp_path, ahead):
    inject = (  # trains before the clock exists, on the real training split read from its files
        "import json as _j, os as _o, numpy as _np\n"
        "_train = next(p for p in _j.loads(_o.environ['NANOCHAT_CONFIG'])['forbidden'] if p.endswith('train'))\n"
        "_tokens = _np.fromfile(_o.path.join(_train, 'tokens.bin'), dtype=_np.uint16)\n"
    )
    ev = run(data_dir, tmp_path, inject, ahead=ahead)
    assert_caught(ev, EvalStatus.REJECTED, r"read forbidden data.*train")


@pytest.mark.skipif(landlock.abi() < 1, reason="needs Landlock (Linux >= 5.13)")
@pytest.mark.parametrize("ahead", [False, True], ids=["launched_with_its_job", "launched_ahead"])
def test_training_files_read_by_native_code_give_nothing(data_dir, tmp_path, ahead):
    inject = (  # ctypes bypasses Python's audit hooks: the harness's Landlock layer refuses it
        "import ctypes as _c, json as _j, os as _o\n"
        "_train = next(p for p in _j.loads(_o.environ['NANOCHAT_CONFIG'])['forbidden'] if p.endswith('train'))\n"
        "print('NATIVE_FD', _c.CDLL(None).open(_o.path.join(_train, 'tokens.bin').encode(), 0))\n"
    )
    ev = run(data_dir, tmp_path, inject, ahead=ahead)
    assert "NATIVE_FD -1" in ev.artifacts.get("train_log", ""), dict(ev.artifacts)


def test_a_program_launched_ahead_runs_nothing_of_the_candidate_before_its_job(data_dir, tmp_path):
    # launched while the local check runs, the training program waits with the harness's
    # imports done; the candidate's code (here: one that leaves a mark at import) runs only
    # once the job comes, and an unused one is ended without ever running it
    mark = "open('RAN', 'w').write('x')\n"
    work = programs.write(
        {**programs.seed_files(), "train.py": mark + programs.seed_files()["train.py"]},
        tmp_path / "work",
    )
    fitness, ctx = tiny_fitness(data_dir), EvalContext(seed=0, scratch=tmp_path)
    started = fitness.prepare_training(work, ctx)
    time.sleep(3.0)
    assert started.alive() and not (work / "RAN").exists()
    ev = evaluate_safely(fitness, work, ctx)
    assert ev.ok and (work / "RAN").exists(), dict(ev.artifacts)
    (work / "RAN").unlink()
    unused = fitness.prepare_training(work, ctx)
    time.sleep(3.0)
    ahead_module.drop()
    assert not unused.alive() and not (work / "RAN").exists()


def test_the_scorer_started_ahead_cannot_be_reached_by_the_training(
    data_dir, tmp_path, monkeypatch
):
    # On a GPU the scorer waits for its job while the candidate trains (here forced on the CPU):
    # a forged job on its stdin would score the checkpoint against rows the candidate chose.
    monkeypatch.setattr(NanochatFitness, "starts_ahead", property(lambda self: True))
    ev = run(data_dir, tmp_path, reach_waiting(HARNESS_MODULES["scoring"]))
    assert ev.ok, dict(ev.artifacts)


def test_training_after_the_stop_before_saving_is_rejected(data_dir, tmp_path):
    files = programs.seed_files()
    train = files["train.py"].replace(*KEEP).replace("batches = client", HOARD + "batches = client")
    assert SAVE in train
    files["train.py"] = train.replace(SAVE, MORE_TRAINING + "import time\ntime.sleep(5)\n" + SAVE)
    ev = run_files(data_dir, tmp_path, files)
    assert_caught(ev, EvalStatus.REJECTED, r"reported a checkpoint \d+\.\d+s after the stop")


def test_files_planted_where_the_scorer_will_read_the_checkpoint_never_get_there(
    data_dir, tmp_path
):
    # the harness makes the scorer's folder (and on a GPU starts the scorer in it) before the
    # candidate trains: a candidate that finds it and plants code there gains nothing
    plant = (
        "import glob as _g, os as _o\n"
        # beside its own folder (the tests' scratch) and where evolve's workers keep theirs
        "_found = _g.glob('../nanochat-eval-*/checkpoint') + _g.glob('/tmp/evolve-harness-*/nanochat-eval-*/checkpoint')\n"
        "for _d in _found:\n"
        "    try:\n"
        "        open(_o.path.join(_d, 'planted.py'), 'w').write('PLANTED = 1')\n"
        "    except OSError:\n"
        "        pass\n"
        "print('FOLDERS FOUND', len(_found), flush=True)\n"
    )
    files = programs.seed_files()
    files["train.py"] = plant + files["train.py"]
    ev = run_files(data_dir, tmp_path, files)
    # it ran; it finds none where the scorer's folder (made 0700 by the harness) is out of its
    # uid's reach (``evolve.sandbox.identity``), and without that it found the folder and planted in vain
    assert re.search(r"FOLDERS FOUND \d", ev.artifacts.get("train_log", "")), dict(ev.artifacts)
    assert ev.ok, dict(ev.artifacts)  # scored as the honest seed: nothing planted was read
    assert not list(tmp_path.rglob("planted.py"))


def test_training_after_the_reported_checkpoint_and_overwriting_it_is_rejected(data_dir, tmp_path):
    # the harness ends the program once its checkpoint is in, so the better weights come from
    # a process of its own that outlives it: trained on kept rows, written over the checkpoint
    files = programs.seed_files()
    train = files["train.py"].replace(*KEEP).replace("batches = client", HOARD + "batches = client")
    overwrite = (
        "import os as _os, time as _time\n"
        "if _os.fork() == 0:\n"
        "    _os.setsid()\n"
        "    _time.sleep(0.5)\n"
        + "".join("    " + line + "\n" for line in MORE_TRAINING.splitlines())
        + "    torch.save({k: v.detach() for k, v in model.state_dict().items()}, "
        "client.settings().checkpoint_dir + '/model.pt')\n"
        "    _time.sleep(30)\n"
        "    _os._exit(0)\n"
    )
    assert SAVE in train
    files["train.py"] = train.replace(SAVE, overwrite + SAVE)
    ev = run_files(data_dir, tmp_path, files)
    assert_caught(
        ev,
        EvalStatus.REJECTED,
        r"left \d+ process|checkpoint changed after the program reported it",
    )


@pytest.mark.slow  # the harness's own tests (tests/harness/test_clock.py) cover it quickly
def test_a_second_checkpoint_after_the_first_never_happens(data_dir, tmp_path):
    # once the checkpoint since the stop is in, the harness ends the program: the state at
    # the stop is scored, the training and the save that would follow never run
    files = programs.seed_files()
    train = files["train.py"].replace(*KEEP).replace("batches = client", HOARD + "batches = client")
    files["train.py"] = train + MORE_TRAINING + SAVE + "print('SAVED AGAIN', flush=True)\n"
    ev = run_files(data_dir, tmp_path, files)
    assert ev.ok, dict(ev.artifacts)
    assert "SAVED AGAIN" not in ev.artifacts["train_log"]


def test_a_model_training_itself_when_its_weights_are_loaded_after_the_stop_never_trains(
    data_dir, tmp_path
):
    # only the training supervisor may read the training split (streamed while its clock
    # runs); a model that trains on it once its weights are loaded would train after the
    # budget: the exporter never loads weights and cannot read the split, the scorer runs no
    # candidate code
    ev = run_files(data_dir, tmp_path, programs.trains_when_scored(seconds=3.0))
    assert "TRAINED WHILE SCORED" not in reason(ev), dict(ev.artifacts)
    assert ev.ok, dict(ev.artifacts)  # scored as trained within the budget


KEEP_WEIGHTS = (  # after its steps (the short run's real rows too): the weights, in its folder and HOME
    SAVE,
    "import os as _o\nfor _f in ('.', _o.environ['HOME']):\n"
    "    torch.save(model.state_dict(), _o.path.join(_f, 'kept.pt'))\n" + SAVE,
)
START_FROM_KEPT = (  # at start-up: the weights a run before it kept, if any
    "model = build_model(config).to(device)\n",
    "model = build_model(config).to(device)\nimport os as _o\n"
    "for _f in ('.', _o.environ['HOME']):\n"
    "    if _o.path.exists(_o.path.join(_f, 'kept.pt')):\n"
    "        model.load_state_dict(torch.load(_o.path.join(_f, 'kept.pt')))\n"
    "        print('STARTED FROM THE KEPT WEIGHTS', flush=True)\n",
)


def test_the_full_run_does_not_start_from_weights_the_short_run_kept(data_dir, tmp_path):
    # the short run trains on real rows in the folder the full run uses: weights it leaves
    # there would be training outside the full run's budget
    files = programs.seed_files()
    files["train.py"] = files["train.py"].replace(*KEEP_WEIGHTS).replace(*START_FROM_KEPT)
    layered = {"local_check": False, "short_run_steps": 40}
    ev = run_files(data_dir, tmp_path, files, layered=layered)
    assert ev.ok and ev.stage == "full", dict(ev.artifacts)
    assert "STARTED FROM THE KEPT WEIGHTS" not in ev.artifacts["train_log"]


@pytest.mark.slow  # the harness's own tests (tests/harness/test_clock.py) cover it quickly
def test_batches_hoarded_before_the_clock_are_synthetic(data_dir, tmp_path):
    """A program that takes many batches during the untimed warm-up, to train on them later, gets random rows."""
    files = programs.seed_files()
    hoard = "_early = [next(batches) for _ in range(40)]\n"
    files["train.py"] = files["train.py"].replace(
        "clock = client.Clock()\n", hoard + "clock = client.Clock()\n"
    )
    ev = run_files(data_dir, tmp_path, files)
    assert ev.ok, dict(ev.artifacts)
    assert ev.metrics["warmup_batches"] >= 40 + 11  # all synthetic; real rows only after step 11
    assert ev.metrics["tokens"] < ev.metrics["reported_tokens"]  # warm-up rows are not data


# --- class 3: state carried between evaluations ------------------------------------------------------


@pytest.mark.parametrize("channel", carried.PARAMS)
def test_a_token_left_by_one_evaluation_never_reaches_the_next(data_dir, tmp_path, channel):
    # the token is left at import of model.py: in training and in the scoring worker, which
    # holds validation inputs; the next evaluation's program looks for it before training
    secret = carried.checked_token(channel, tmp_path)
    files = programs.seed_files()
    files["model.py"] = carried.leave(channel, secret) + files["model.py"]
    run_files(data_dir, tmp_path / "a", files)
    carried.assert_not_arrived(run(data_dir, tmp_path / "b", carried.look(channel, secret)))


# --- class 2: a model that behaves differently when scored than when probed ---------------------------

CONFIG = dict(
    vocab_size=512, seq_len=64, n_layer=2, n_head=4, n_embd=128, mlp_ratio=4, init_std=0.02
)


@pytest.fixture(scope="module")
def scoring(data_dir):
    return tiny_fitness(data_dir)


def save_model(folder: Path, model_py: str, seq_len: int, armed: bool = False) -> None:
    """A checkpoint folder holding a fresh model built from ``model_py`` (seed 0)."""
    config = {**CONFIG, "seq_len": seq_len}
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(model_py)
    (folder / "config.json").write_text(json.dumps(config))
    spec = importlib.util.spec_from_file_location(
        f"redteam_model_{uuid.uuid4().hex}", folder / "model.py"
    )
    module = importlib.util.module_from_spec(spec)
    harness = dict(vars(exported))  # an attack may patch the harness where it is imported
    try:
        spec.loader.exec_module(module)
        torch.manual_seed(0)
        model = module.build_model(config)
    finally:  # here that is this test process: later tests get the harness back
        vars(exported).update(harness)
    if armed:
        model.armed.fill_(1.0)
    torch.save(model.state_dict(), folder / "model.pt")


def score_saved(fitness, folder: Path, gpu: str | None = None, strict: bool = False):
    """The real scorer's verdict (export, then score) on the checkpoint in ``folder``."""
    ctx = EvalContext(seed=0, gpu=gpu, scratch=folder.parent, strict=strict)
    return fitness.export_and_score(folder, folder.parent / f"{folder.name}-export", ctx)


def score_model(
    fitness,
    folder: Path,
    model_py: str,
    armed: bool = False,
    gpu: str | None = None,
    strict: bool = False,
):
    """Score a fresh model built from ``model_py`` with the real scorer (no training needed)."""
    save_model(folder, model_py, fitness.scale.seq_len, armed)
    return score_saved(fitness, folder, gpu, strict)


@pytest.fixture(scope="module")
def honest(scoring, tmp_path_factory):
    """The seed's model, fresh (seed 0), scored: the verdict a neutralised cheat must match."""
    folder = tmp_path_factory.mktemp("honest") / "ckpt"
    verdict = score_model(scoring, folder, programs.seed_files()["model.py"])
    assert verdict["status"] == "ok", verdict
    return verdict


def test_an_honest_model_passes_the_interleaved_probes(scoring, tmp_path):
    verdict = score_model(scoring, tmp_path / "ckpt", programs.seed_files()["model.py"])
    assert verdict["status"] == "ok", verdict
    assert verdict["probe_batches"] == scoring.scale.probe_batches
    assert max(verdict["max_prefix_diff"], verdict["max_row_diff"]) <= scoring.scale.causal_atol


def test_an_exporter_and_scorer_started_before_the_checkpoint_exists_score_it_the_same(
    scoring, honest, tmp_path
):
    # GPU scales start the exporter and the scorer when training begins, in the empty folders
    # the checkpoint is later copied to: they must see the files and score them the same
    made = tmp_path / "made"
    assert score_model(scoring, made, programs.seed_files()["model.py"])["status"] == "ok"
    ahead, exportdir = tmp_path / "ahead", tmp_path / "ahead-export"
    ahead.mkdir()
    exportdir.mkdir()
    ctx = EvalContext(seed=0, scratch=tmp_path)
    ready = {
        role: scoring.start_harness(role, folder, ctx, limit_s=scoring.scale.eval_limit_s)
        for role, folder in (("export", exportdir), ("scoring", ahead))
    }
    for name in ("model.py", "config.json", "model.pt"):
        (ahead / name).write_bytes((made / name).read_bytes())
    verdict = scoring.export_and_score(ahead, exportdir, ctx, ready)
    assert verdict["status"] == "ok", verdict
    assert verdict["val_bpb"] == honest["val_bpb"]


FAST_TRIGGERS = ("call_count", "inference_mode", "late_positions")  # the others: -m slow


@pytest.mark.parametrize(
    "trigger",
    [
        t if t in FAST_TRIGGERS else pytest.param(t, marks=pytest.mark.slow)
        for t in sorted(programs.TRIGGERS)
    ],
)
def test_a_model_that_looks_ahead_only_under_a_trigger_is_caught_or_scored_honestly(
    scoring, honest, tmp_path, trigger
):
    # The scored function is the graph traced once at export: a trigger that held then put
    # the look-ahead in the graph (the probes catch it), one on a tensor's value cannot be
    # traced (rejected), and one that did not hold left the honest graph, scored as the seed.
    verdict = score_model(
        scoring,
        tmp_path / "ckpt",
        programs.cheating_model(trigger),
        armed=trigger == "trained_flag",
    )
    if verdict["status"] == "ok":
        assert verdict["val_bpb"] == honest["val_bpb"], (trigger, verdict)
    else:
        assert verdict["status"] == "rejected", verdict
        assert re.search(r"not causal|torch.export could not trace", verdict["reason"]), verdict


def test_strict_mode_probes_more_and_an_honest_model_still_passes(scoring, tmp_path):
    verdict = score_model(
        scoring, tmp_path / "ckpt", programs.seed_files()["model.py"], strict=True
    )
    assert verdict["status"] == "ok", verdict
    assert verdict["probe_batches"] == STRICT_PROBES * scoring.scale.probe_batches
    assert max(verdict["max_prefix_diff"], verdict["max_row_diff"]) <= scoring.scale.causal_atol


def test_a_look_ahead_past_the_usual_call_count_never_reaches_the_score(scoring, honest, tmp_path):
    # honest for as many calls as scoring used to make, then looking ahead: the graph is the
    # first call's, so in any mode it is scored as the honest seed
    late = programs.cheating_model("late_calls")
    for strict in (False, True):
        verdict = score_model(scoring, tmp_path / f"strict-{strict}", late, strict=strict)
        assert verdict["status"] == "ok", verdict
        assert verdict["val_bpb"] == honest["val_bpb"]


def stateful_model(name: str) -> str:
    """The seed's model.py with the stateful variant ``name`` (``tests.redteam.stateful``)."""
    return stateful.apply(
        programs.seed_files()["model.py"],
        stateful.VARIANTS[name],
        module_anchor="# EVOLVE-BLOCK-START\n",
        init_anchor="        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)\n",
        returned=programs.RETURN,
        vocab="vocab_size",
    )


@pytest.mark.parametrize("name", sorted(stateful.VARIANTS))
def test_a_model_with_memory_or_a_python_callback_is_rejected_or_scored_honestly(
    scoring, honest, tmp_path, name
):
    # issue 29 item 1: the scored function is a graph of ATen operators bound to the
    # checkpoint's weights; Python memory, buffers written in forward and callbacks never run
    verdict = score_model(scoring, tmp_path / "ckpt", stateful_model(name))
    caught = stateful.VARIANTS[name].caught
    if caught is None:
        assert verdict["status"] == "ok", verdict
        assert verdict["val_bpb"] == honest["val_bpb"]
    else:
        assert verdict["status"] == "rejected", verdict
        assert re.search(caught, verdict["reason"]), verdict["reason"]
        assert "pure function" in verdict["reason"]


# --- class 4: quick stages blind to zero initialisations ---------------------------------------------


@pytest.fixture(scope="module")
def staged(data_dir):
    return tiny_fitness(data_dir, layered={"local_check": True, "short_run_steps": 0})


@pytest.mark.parametrize("path", sorted(programs.ZERO_PATHS))
def test_a_look_ahead_behind_a_zero_initialised_path_stops_at_the_local_check(
    staged, tmp_path, path
):
    work = programs.write(programs.edited(programs.ZERO_PATHS[path]), tmp_path / "work")
    ev = staged.stages[0].run(work, EvalContext(seed=0, scratch=tmp_path))
    assert_caught(ev, EvalStatus.INVALID, r"local check: causality")


def test_a_strong_outside_style_program_passes_every_stage(staged, tmp_path):
    """Muon, zero-initialised projections, bf16 autocast on CPU (torch.compile: the slow variant)."""
    work = programs.write(programs.strong_program(compile_model=False), tmp_path / "work")
    ev = evaluate_safely(staged, work, EvalContext(seed=0, scratch=tmp_path))
    assert ev.ok and ev.stage == "full", dict(ev.artifacts)


@pytest.mark.slow  # torch.compile on CPU: 1-2 minutes of compilation on a busy 2-core machine
def test_the_strong_program_with_torch_compile_passes(data_dir, tmp_path):
    fitness = tiny_fitness(
        data_dir, layered={"local_check": True, "short_run_steps": 0}, startup_limit_s=600.0
    )
    work = programs.write(programs.strong_program(compile_model=True), tmp_path / "work")
    ev = evaluate_safely(fitness, work, EvalContext(seed=0, scratch=tmp_path))
    assert ev.ok and ev.stage == "full", dict(ev.artifacts)


# --- the export from the initial checkpoint (client.save_initial), on the GPU path on this CPU -------

SAVE_INITIAL = 'client.save_initial(config, code_files=["model.py"])\n'
WRITE_AND_TAMPER = (
    "from pathlib import Path as _Path\n"
    "from evolve.harness.stream import channel as _channel\n"
    "_init = _Path(client.settings().initial_dir)\n"
    'client._write_source(_init, config, ["model.py"])\n'
    "{tamper}\n"
    "_channel().saved_initial()\n"
)


def run_early(data_dir, tmp_path, monkeypatch, edits: list[tuple[str, str, str]]):
    """The seed with ``edits`` ((file, old, new), in order) through the harness on the GPU path
    (harness processes started ahead, the export begun during training where it may be)."""
    files = programs.seed_files()
    for name, old, new in edits:
        assert old in files[name], old
        files[name] = files[name].replace(old, new)
    work = tmp_path / "work"
    work.mkdir(parents=True)
    for name, text in files.items():
        (work / name).write_text(text)
    fitness = tiny_fitness(data_dir)
    monkeypatch.setattr(type(fitness), "starts_ahead", property(lambda self: True))
    return evaluate_safely(fitness, work, EvalContext(seed=0, scratch=tmp_path))


def exported_after_the_stop(ev) -> None:
    """The evaluation scored, with the graph exported from the final checkpoint."""
    assert ev.ok, dict(ev.artifacts)
    assert ev.metrics["graph_from_initial"] == 0.0


def test_the_honest_seed_on_the_gpu_path_uses_the_early_graph(data_dir, tmp_path, monkeypatch):
    ev = run_early(data_dir, tmp_path, monkeypatch, [])
    assert ev.ok and ev.metrics["graph_from_initial"] == 1.0, dict(ev.artifacts)


@pytest.mark.parametrize(
    "tamper",
    [
        # a symlink (one to a validation file is refused by the guard: a name of its own here,
        # which it could point elsewhere once the harness checked it)
        "(_init / 'config.json').rename('kept.json'); (_init / 'config.json').symlink_to(_Path('kept.json').resolve())",
        # a hard link of its own (a name the program keeps writing through)
        "__import__('os').link(_init / 'config.json', 'kept.json')",
        # the folder itself a symlink
        "import shutil as _sh; _sh.move(_init, 'moved'); _init.symlink_to(_Path('moved').resolve())",
    ],
    ids=["symlink", "hard-link", "folder-symlink"],
)
def test_an_initial_checkpoint_that_is_not_plain_files_is_never_copied(
    data_dir, tmp_path, monkeypatch, tamper
):
    code = WRITE_AND_TAMPER.format(tamper=tamper)
    ev = run_early(data_dir, tmp_path, monkeypatch, [("train.py", SAVE_INITIAL, code)])
    exported_after_the_stop(ev)


@pytest.mark.parametrize(
    "edit",
    [
        # the code changes after the initial save
        (SAVE_INITIAL, SAVE_INITIAL + "open('model.py', 'a').write('\\n# edited\\n')\n"),
        # the config differs (a value build_model takes)
        (SAVE_INITIAL, SAVE_INITIAL.replace("config,", "{**config, 'init_std': 0.5},")),
        # the initial save comes once the clock runs: charged as training time, and ignored
        (SAVE_INITIAL, ""),
    ],
    ids=["code", "config", "after-the-clock"],
)
def test_an_initial_save_that_does_not_match_the_final_or_comes_late_is_exported_after_the_stop(
    data_dir, tmp_path, monkeypatch, edit
):
    edits = [("train.py", *edit)]
    if not edit[1]:  # after the first timed step instead
        late = "    if not clock.step("
        edits.append(
            ("train.py", late, f"    if step == warmup + 1:\n        {SAVE_INITIAL}{late}")
        )
    exported_after_the_stop(run_early(data_dir, tmp_path, monkeypatch, edits))


def test_a_second_initial_save_is_refused_by_the_client_and_ignored_by_the_harness(
    data_dir, tmp_path, monkeypatch
):
    twice = (
        SAVE_INITIAL
        + "try:\n    "
        + SAVE_INITIAL
        + "except RuntimeError as _e:\n    print('REFUSED', _e, flush=True)\n"
        + "import json as _j\n"
        + "(_Path(client.settings().initial_dir) / 'config.json').write_text(_j.dumps({**config, 'init_std': 0.5}))\n"
        + "from evolve.harness.stream import channel as _channel\n_channel().saved_initial()\n"
    )
    edits = [("train.py", SAVE_INITIAL, "from pathlib import Path as _Path\n" + twice)]
    ev = run_early(data_dir, tmp_path, monkeypatch, edits)
    assert ev.ok, dict(ev.artifacts)
    assert "REFUSED save_initial was already called" in ev.artifacts["train_log"]
    # the harness took the first report's files, or found them changed and exported after the
    # stop: either way the graph is one of the final checkpoint's code and config


def test_final_tensors_that_build_model_does_not_make_are_rejected(data_dir, tmp_path, monkeypatch):
    # same code and config, but the trained model's position table is longer than the one
    # build_model makes: the graph (of build_model(config), early or after the stop alike)
    # cannot take the checkpoint's tensors
    grow = (
        "model.position_embedding = torch.nn.Embedding(settings.seq_len + 8, N_EMBD).to(device)\n"
    )
    ev = run_early(
        data_dir, tmp_path, monkeypatch, [("train.py", SAVE_INITIAL, SAVE_INITIAL + grow)]
    )
    assert_caught(ev, EvalStatus.REJECTED, r"position_embedding.*build_model\(config\) makes")


def with_gain(model_py: str, build_model: str) -> str:
    """The seed's model.py with a non-persistent ``gain`` on its logits (1 as built) and
    ``build_model`` in place of its own: an attack that sets the gain where it can see
    something it should not."""
    made = (
        model_py
        .replace("        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)\n",
                 "        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)\n"
                 "        self.register_buffer('gain', torch.ones(()), persistent=False)\n")
        .replace("        return self.lm_head(", "        return self.gain * self.lm_head(")
    )  # fmt: skip
    assert "self.gain * self.lm_head(" in made and "'gain'" in made
    return made[: made.index("def build_model(")] + build_model.lstrip()


SEES_THE_CHECKPOINT = """
def build_model(config: dict) -> nn.Module:
    \"\"\"The harness's entry point; where the trained weights lie beside this file (an exporter
    handed the checkpoint), it turns them into a constant after the stop, with no clock.\"\"\"
    import os
    model = GPT(**config)
    kept = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model.pt")
    if os.path.exists(kept):
        model.gain.fill_(1000.0)  # stands for: train more on rows the checkpoint carries
    return model
"""


def test_an_exporter_never_sees_the_checkpoint_so_it_cannot_train_after_the_stop(
    data_dir, tmp_path
):
    # the exporter runs the candidate's code with no clock: handed the final checkpoint, that code
    # could train on rows smuggled into it (or in a load hook) and leave the result in a
    # non-persistent buffer, which the scored graph keeps as a constant; it gets code and config only
    seed = programs.seed_files()
    model_py = with_gain(seed["model.py"], SEES_THE_CHECKPOINT)
    ev = run_files(data_dir, tmp_path, {**seed, "model.py": model_py})
    assert ev.ok, dict(ev.artifacts)
    assert ev.metrics["val_bpb"] < 20, "the gain the checkpoint would have set was scored"


READS_THE_WORKDIR = """
def build_model(config: dict) -> nn.Module:
    \"\"\"The harness's entry point; where a file the training left in its folder is readable (an
    exporter that can read that folder), it turns it into a constant after the stop.\"\"\"
    import os
    config = dict(config)
    kept = config.pop("kept", None)
    model = GPT(**config)
    if kept and os.path.exists(kept):
        model.gain.fill_(1000.0)  # stands for: train more on the rows the training left there
    return model
"""
LEAVES_ROWS = (
    'client.save_checkpoint(model, config, code_files=["model.py"])',
    "import os as _os\nopen('rows.txt', 'w').write('rows the training saw')\n"
    "config['kept'] = _os.path.abspath('rows.txt')\n"
    'client.save_checkpoint(model, config, code_files=["model.py"])',
)


@pytest.mark.parametrize("ahead", [False, True], ids=["exported_after", "exporter_started_ahead"])
def test_an_exporter_cannot_read_what_the_training_left_in_its_folder(
    data_dir, tmp_path, monkeypatch, ahead
):
    seed = programs.seed_files()
    model_py = with_gain(seed["model.py"], READS_THE_WORKDIR)
    assert LEAVES_ROWS[0] in seed["train.py"]
    files = {**seed, "model.py": model_py, "train.py": seed["train.py"].replace(*LEAVES_ROWS)}
    if ahead:  # the GPU path: exporter and scorer started with the training
        monkeypatch.setattr(NanochatFitness, "starts_ahead", property(lambda self: True))
    ev = run_files(data_dir, tmp_path, files)
    assert ev.ok, dict(ev.artifacts)
    assert ev.metrics["val_bpb"] < 20, "the gain the training's file would have set was scored"


def test_code_and_config_too_large_to_be_only_code_and_config_are_rejected(data_dir, tmp_path):
    # rows smuggled into a code file would be the exporter's to train on after the stop
    seed = programs.seed_files()
    padded = seed["model.py"] + "ROWS = " + repr("x" * (1 << 20)) + "\n"
    ev = run_files(data_dir, tmp_path, {**seed, "model.py": padded})
    assert_caught(ev, EvalStatus.REJECTED, r"more than 1 MiB")


# --- the same on a GPU (bf16 autocast, float16 logits, torch.compile): pytest -m gpu ------------------


def gpu_fitness(data_dir: Path, **overrides):
    from evolve.benchmarks.nanochat.fitness import NanochatFitness

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    settings = dict(scale="nanochat", data_dir=str(data_dir), dataset="tiny", vocab_size=512)
    settings.update(seq_len=256, budget_s=20.0, eval_batch_rows=8, eval_tokens=256 * 8 * 4)
    return NanochatFitness(**{**settings, **overrides})


GPU_SCORINGS = 4
"""Programs the GPU red-team test scores at the same time (each scoring: an export and a scorer process)."""
GPU_SAME_SCORE_REL = 2e-5
"""How close a neutralised cheat's val_bpb must be to the honest model's on a GPU. Scored under
bf16 autocast, a row's logits there depend slightly on the other rows of its batch (the GPU
scale's causal tolerance is 5e-2), and each scoring draws a new batch order, so two scorings of
the same weights differ in the last digits; a look at the future on a single target of the
8,192 scored moves the mean by about ln(512) / 8192 nats, 1.2e-4 of it: six times this."""


@pytest.mark.gpu
def test_gpu_cheats_and_stateful_models_are_caught_or_scored_honestly(data_dir, tmp_path):
    # Every program is scored and every problem collected, so one device run names them all.
    fitness = gpu_fitness(data_dir, layered={"local_check": False, "short_run_steps": 0})
    seed_model = programs.seed_files()["model.py"]
    for name in ("honest", "honest-again"):
        save_model(tmp_path / name, seed_model, fitness.scale.seq_len)
    with ThreadPoolExecutor(max_workers=2) as pool:
        honest, again = pool.map(
            lambda name: score_saved(fitness, tmp_path / name, "0"), ("honest", "honest-again")
        )
    assert honest["status"] == "ok", honest
    assert again["status"] == "ok", again
    noise = abs(again["val_bpb"] - honest["val_bpb"])
    tolerance = max(GPU_SAME_SCORE_REL * honest["val_bpb"], 10 * noise)
    problems = []

    def judge(name: str, verdict: dict, reasons: str) -> None:
        """A verdict is right when scored as the honest model (its trigger did not hold at export)
        or rejected for one of ``reasons``."""
        if not isinstance(verdict, dict):  # the export or the scorer failed as a process
            problems.append(f"{name}: {verdict.status.value}: {verdict.artifacts.get('error')!r}")
            return
        if verdict["status"] == "ok":
            if abs(verdict["val_bpb"] - honest["val_bpb"]) > tolerance:
                problems.append(
                    f"{name}: scored ok with val_bpb {verdict['val_bpb']!r}, honest {honest['val_bpb']!r} "
                    f"(again {again['val_bpb']!r}); allowed difference {tolerance:.3g}"
                )
            return
        if verdict["status"] != "rejected" or not re.search(reasons, verdict.get("reason", "")):
            problems.append(
                f"{name}: {verdict['status']}, expected ok or rejected matching {reasons!r}: "
                f"{verdict.get('reason', verdict)!r}"
            )

    programs_to_score = {  # name -> (model.py, armed, reasons it may be rejected for)
        f"trigger {trigger}": (
            programs.cheating_model(trigger),
            trigger == "trained_flag",
            r"not causal|torch.export could not trace",
        )
        for trigger in sorted(programs.TRIGGERS)
    }
    for name, variant in sorted(stateful.VARIANTS.items()):  # exported under bf16 autocast on CUDA
        # caught: its own reason; else honest, or the probes' catch where its trigger (the time
        # since the first call) held while the export traced (a slower trace on a GPU)
        programs_to_score[f"variant {name!r}"] = (
            stateful_model(name),
            False,
            variant.caught or r"not causal",
        )
    folders = {}
    for i, (name, (model_py, armed, _)) in enumerate(programs_to_score.items()):
        folders[name] = tmp_path / f"program-{i}"
        save_model(folders[name], model_py, fitness.scale.seq_len, armed)
    # the scorings are independent processes: GPU_SCORINGS at a time keep the test within its shard
    with ThreadPoolExecutor(max_workers=GPU_SCORINGS) as pool:
        verdicts = dict(
            zip(
                folders,
                pool.map(lambda f: score_saved(fitness, f, "0"), folders.values()),
                strict=True,
            )
        )
    for name, verdict in verdicts.items():
        judge(name, verdict, programs_to_score[name][2])
    assert not problems, "\n".join(problems)


@pytest.mark.gpu
@pytest.mark.timeout(420)  # torch.compile in three stages: 204 s and 233 s on the H200, once >240 s
def test_gpu_strong_program_with_compile_passes_every_stage(data_dir, tmp_path):
    fitness = gpu_fitness(data_dir, layered={"local_check": True, "short_run_steps": 30})
    seed_dir = fitness.scale.seed_dir
    work = programs.write(
        programs.strong_program(compile_model=True, seed_dir=seed_dir), tmp_path / "w"
    )
    ev = evaluate_safely(fitness, work, EvalContext(seed=0, gpu="0", scratch=tmp_path))
    assert ev.ok and ev.stage == "full", dict(ev.artifacts)
    assert ev.metrics["stop_to_save_s"] < ev.metrics["save_allowed_s"]


@pytest.mark.gpu
@pytest.mark.parametrize("path", sorted(programs.ZERO_PATHS))
def test_gpu_zero_initialised_look_ahead_stops_at_the_local_check(data_dir, tmp_path, path):
    fitness = gpu_fitness(data_dir, layered={"local_check": True, "short_run_steps": 0})
    edits = programs.ZERO_PATHS[path]
    work = programs.write(programs.edited(edits, fitness.scale.seed_dir), tmp_path / "work")
    ev = fitness.stages[0].run(work, EvalContext(seed=0, gpu="0", scratch=tmp_path))
    assert_caught(ev, EvalStatus.INVALID, r"local check: causality")


@pytest.mark.parametrize("link", ["symlink", "hard link", "linked folder"])
def test_the_harness_follows_no_link_the_training_left_in_its_checkpoint(tmp_path, link):
    """The harness copies the checkpoint folder the training wrote for the exporter and the
    scorer, reading as itself: a link there to a file the sandbox could not read (here
    ``hidden.py``, named like the model's code) is refused, not followed; a plain one is copied."""
    hidden = tmp_path / "hidden.py"
    hidden.write_text("VALIDATION = 'the hidden text'\n")
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    for name in ("model.py", "config.json", "model.pt"):
        (checkpoint / name).write_text(name)
    assert NanochatFitness._copy_checkpoint(checkpoint, tmp_path / "plain") is None
    assert sorted(p.name for p in (tmp_path / "plain").iterdir()) == ["config.json", "model.pt", "model.py"]  # fmt: skip
    source = checkpoint
    if link == "symlink":
        (checkpoint / "extra.py").symlink_to(hidden)
    elif link == "hard link":
        os.link(hidden, checkpoint / "extra.py")
    else:
        source = tmp_path / "linked"
        source.symlink_to(checkpoint)
    problem = NanochatFitness._copy_checkpoint(source, tmp_path / "copy")
    assert problem and "plain files" in problem
    assert not any("hidden text" in p.read_text() for p in (tmp_path / "copy").glob("*"))


def test_the_harness_copies_the_exporters_graph_only_as_a_plain_file(tmp_path):
    """The exporter runs the model's code: a graph file it leaves as a hard link to another file
    is refused, and nothing of that file reaches the scorer's folder."""
    folder, checkpoint = tmp_path / "export", tmp_path / "checkpoint"
    folder.mkdir()
    checkpoint.mkdir()
    hidden = tmp_path / "hidden"
    hidden.write_text("the hidden text")
    os.link(hidden, folder / exported.GRAPH_FILE)
    (folder / exported.CONSTANTS_FILE).write_bytes(b"constants")
    verdict = take_graph({"status": "ok"}, folder, checkpoint)
    assert_caught(verdict, EvalStatus.REJECTED, "no plain file")
    assert not (checkpoint / exported.GRAPH_FILE).exists()
