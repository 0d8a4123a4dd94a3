"""The training harness started ahead of its job (on a GPU, while the local check runs): the next
training of its workdir takes it and scores as usual; any other training ends it."""

from pathlib import Path

from evolve.benchmarks.nanochat import ahead, prepare

from evolve.harness.fitness import EvalContext, evaluate_safely
from tests.fixtures.nanochat_tiny import tiny_fitness
from tests.harness.test_phases import assert_adds_up

SEED = Path(prepare.__file__).parent / "seed"


def seed_workdir(folder: Path) -> Path:
    folder.mkdir()
    for path in SEED.glob("*.py"):
        (folder / path.name).write_text(path.read_text())
    return folder


def test_the_next_training_of_its_workdir_takes_it_and_is_scored_as_usual(
    data_dir, tmp_path, monkeypatch
):
    fitness = tiny_fitness(data_dir, layered={"local_check": False, "short_run_steps": 0})
    work, ctx = seed_workdir(tmp_path / "work"), EvalContext(seed=0, scratch=tmp_path)
    taken = []
    monkeypatch.setattr(
        ahead, "take", lambda w, c, take=ahead.take: taken.append(take(w, c)) or taken[-1]
    )
    started = fitness.prepare_training(work, ctx)
    ev = fitness.evaluate(work, ctx)
    assert ev.ok, dict(ev.artifacts)
    assert taken == [started] and not started.alive()
    assert ev.metrics["steps"] > fitness.scale.untimed_steps and ev.metrics["val_bpb"] > 0


def test_one_kept_for_another_workdir_or_context_is_ended_not_used(data_dir, tmp_path):
    fitness = tiny_fitness(data_dir, layered={"local_check": False, "short_run_steps": 0})
    work, ctx = seed_workdir(tmp_path / "work"), EvalContext(seed=0, scratch=tmp_path)
    other = fitness.prepare_training(seed_workdir(tmp_path / "other"), ctx)
    assert ahead.take(work, ctx) is None and not other.alive()
    reseeded = fitness.prepare_training(work, ctx)
    assert ahead.take(work, EvalContext(seed=1, scratch=tmp_path)) is None  # the seed is in its env
    assert not reseeded.alive()


def test_the_local_check_launches_the_full_runs_program_which_takes_it(
    data_dir, tmp_path, monkeypatch
):
    fitness = tiny_fitness(data_dir, layered={"local_check": True, "short_run_steps": 0})
    monkeypatch.setattr(type(fitness), "starts_ahead", property(lambda self: True))  # as on a GPU
    work, ctx = seed_workdir(tmp_path / "work"), EvalContext(seed=0, scratch=tmp_path)
    taken = []
    monkeypatch.setattr(
        ahead, "take", lambda w, c, take=ahead.take: taken.append(take(w, c)) or taken[-1]
    )
    ev = evaluate_safely(fitness, work, ctx)
    assert ev.ok and ev.stage == "full", dict(ev.artifacts)
    assert len(taken) == 1 and taken[0] is not None and not taken[0].alive()
    # the local check's three phases (its worker's from the probe's report), adding up with the rest
    spent = assert_adds_up(ev)
    assert {"time_local_check", "time_local_check_worker", "time_local_check_verdict"} <= set(spent)


def test_a_failed_local_check_ends_the_program_launched_for_the_full_run(
    data_dir, tmp_path, monkeypatch
):
    fitness = tiny_fitness(data_dir, layered={"local_check": True, "short_run_steps": 0})
    monkeypatch.setattr(type(fitness), "starts_ahead", property(lambda self: True))
    work, ctx = seed_workdir(tmp_path / "work"), EvalContext(seed=0, scratch=tmp_path)
    model = (work / "model.py").read_text()
    (work / "model.py").write_text(model.replace("def build_model", "def _gone"))  # cannot load
    launched = []
    monkeypatch.setattr(
        ahead, "keep", lambda w, c, s, keep=ahead.keep: launched.append(s) or keep(w, c, s)
    )
    ev = evaluate_safely(fitness, work, ctx)
    assert not ev.ok and ev.stage == "local_check", dict(ev.artifacts)
    assert len(launched) == 1 and not launched[0].alive()


def test_a_compiler_setting_made_too_late_is_named_in_the_log(data_dir, tmp_path):
    """torch's compiler is imported before the go: a variable it reads at import, set by the
    program, is named in the log with the fix; one read later (the cache folder) is not."""
    fitness = tiny_fitness(data_dir, layered={"local_check": False, "short_run_steps": 0})
    work, ctx = seed_workdir(tmp_path / "work"), EvalContext(seed=0, scratch=tmp_path)
    train = (work / "train.py").read_text()
    settings = 'import os\nos.environ["TORCHINDUCTOR_MAX_AUTOTUNE"] = "1"\nos.environ["TORCHINDUCTOR_CACHE_DIR"] = "c"\n'
    (work / "train.py").write_text(train.replace("import math\n", settings + "import math\n", 1))
    fitness.prepare_training(work, ctx)
    ev = fitness.evaluate(work, ctx)
    assert ev.ok, dict(ev.artifacts)
    log = ev.artifacts["train_log"]
    assert "TORCHINDUCTOR_MAX_AUTOTUNE is set after the harness imported torch" in log
    assert "torch._inductor.config" in log and "TORCHINDUCTOR_CACHE_DIR" not in log

