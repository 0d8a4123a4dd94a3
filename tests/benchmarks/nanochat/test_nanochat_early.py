"""The export from the initial checkpoint (``client.save_initial``): on the GPU path it runs while the
candidate trains and its graph scores the final checkpoint exactly as an export after the stop;
on the CPU path, or without the call, the export runs after the stop as before."""

import json
from pathlib import Path

import pytest
import torch
from evolve.benchmarks.nanochat import early as early_module
from evolve.benchmarks.nanochat import prepare, scorer
from evolve.benchmarks.nanochat.early import EarlyExport
from evolve.benchmarks.nanochat.supervisor import INITIAL, checkpoint_digest

from evolve.harness.fitness import EvalContext, evaluate_safely
from tests.fixtures.nanochat_tiny import tiny_fitness
from tests.harness.test_phases import assert_adds_up

SEED = Path(prepare.__file__).parent / "seed"
SAVE_INITIAL = 'client.save_initial(config, code_files=["model.py"])\n'


def workdir(folder: Path, train_edit: tuple[str, str] | None = None) -> Path:
    folder.mkdir()
    for path in SEED.glob("*.py"):
        text = path.read_text()
        if train_edit and path.name == "train.py":
            assert train_edit[0] in text
            text = text.replace(*train_edit)
        (folder / path.name).write_text(text)
    return folder


@pytest.fixture
def gpu_path(data_dir, monkeypatch):
    """The fitness on the GPU path (harness processes started ahead), on this CPU."""
    fitness = tiny_fitness(data_dir)
    monkeypatch.setattr(type(fitness), "starts_ahead", property(lambda self: True))
    return fitness


def test_on_the_gpu_path_the_seed_is_scored_with_the_graph_exported_while_it_trained(
    gpu_path, tmp_path
):
    assert SAVE_INITIAL in (SEED / "train.py").read_text()
    ev = evaluate_safely(
        gpu_path, workdir(tmp_path / "work"), EvalContext(seed=0, scratch=tmp_path)
    )
    assert ev.ok, dict(ev.artifacts)
    assert ev.metrics["graph_from_initial"] == 1.0
    assert ev.metrics["graph_built_ahead"] == 1.0  # by the scorer started with that graph
    assert_adds_up(ev)


@pytest.mark.parametrize("on_gpu_path", [True, False])
def test_without_save_initial_or_on_the_cpu_path_the_export_runs_after_the_stop(
    data_dir, tmp_path, monkeypatch, on_gpu_path
):
    fitness = tiny_fitness(data_dir)
    monkeypatch.setattr(type(fitness), "starts_ahead", property(lambda self: on_gpu_path))
    edit = (SAVE_INITIAL, "") if on_gpu_path else None  # the CPU path ignores the call
    ev = evaluate_safely(
        fitness, workdir(tmp_path / "work", edit), EvalContext(seed=0, scratch=tmp_path)
    )
    assert ev.ok, dict(ev.artifacts)
    assert ev.metrics["graph_from_initial"] == 0.0
    assert ev.metrics["graph_built_ahead"] == 0.0


CONFIG = dict(
    vocab_size=512, seq_len=64, n_layer=2, n_head=4, n_embd=128, mlp_ratio=4, init_std=0.02
)


def save(folder: Path, seed: int, model_py: str | None = None, config: dict | None = None) -> Path:
    """A checkpoint of the seed's model built with torch seed ``seed``."""
    import importlib.util
    import uuid

    folder.mkdir(parents=True)
    (folder / "model.py").write_text(model_py or (SEED / "model.py").read_text())
    (folder / "config.json").write_text(json.dumps(config or CONFIG))
    spec = importlib.util.spec_from_file_location(f"early_{uuid.uuid4().hex}", folder / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(seed)
    torch.save(module.build_model(config or CONFIG).state_dict(), folder / "model.pt")
    return folder


def early_export(
    fitness, tmp_path: Path, initial: Path, digest: str | None = None, evaldir: Path | None = None
) -> EarlyExport:
    """An EarlyExport of ``initial`` by an exporter started ahead, told the digest (the folder's own
    unless given) as the training harness's line tells it, its export finished. With
    ``evaldir``, a scorer is started there with the graph (not closed: the scorer waits);
    without, none is."""
    ctx, folder = EvalContext(seed=0, scratch=tmp_path), tmp_path / "export"
    folder.mkdir()
    exporter = fitness.start_harness("export", folder, ctx, limit_s=fitness.scale.eval_limit_s)
    made = EarlyExport(
        initial,
        folder,
        exporter,
        lambda f, e: fitness.run_export(f, ctx, e),
        lambda graph: evaldir and fitness.preloaded_scorer(graph, evaldir, ctx, ()),
    )
    made.heard(json.dumps({INITIAL: {"digest": digest or checkpoint_digest(initial)}}))
    assert made.began
    made.join() if evaldir else made.close()
    return made


def test_the_early_graph_bound_to_the_final_weights_scores_as_an_export_after_the_stop(
    data_dir, tmp_path
):
    fitness = tiny_fitness(data_dir)
    ctx = EvalContext(seed=0, scratch=tmp_path)
    final = save(tmp_path / "final", seed=1)
    late = fitness.export_and_score(final, tmp_path / "late-export", ctx)
    assert late["status"] == "ok", late
    made = early_export(fitness, tmp_path, save(tmp_path / "initial", seed=0))
    again = save(tmp_path / "final-again", seed=1)
    verdict = fitness.export_and_score(again, tmp_path / "unused", ctx, early=made)
    assert verdict["status"] == "ok" and verdict["graph_from_initial"], verdict
    assert verdict["val_bpb"] == late["val_bpb"]


def test_a_scorer_started_with_the_early_graph_builds_it_ahead_and_scores_as_one_started_late(
    data_dir, tmp_path
):
    fitness = tiny_fitness(data_dir)
    ctx = EvalContext(seed=0, scratch=tmp_path)
    late = fitness.export_and_score(save(tmp_path / "final", seed=1), tmp_path / "late", ctx)
    assert late["status"] == "ok" and not late["graph_built_ahead"], late
    final = save(tmp_path / "final-again", seed=1)
    made = early_export(fitness, tmp_path, save(tmp_path / "initial", seed=0), evaldir=final)
    try:
        verdict = fitness.export_and_score(final, tmp_path / "unused", ctx, early=made)
    finally:
        made.close()
    assert verdict["status"] == "ok" and verdict["graph_from_initial"], verdict
    assert verdict["graph_built_ahead"], verdict
    assert verdict["val_bpb"] == late["val_bpb"]


def test_a_scorer_started_with_the_early_graph_never_scores_with_it_once_the_graph_changed(
    data_dir, tmp_path
):
    # the model's code changed after the initial save: the export after the stop writes
    # another graph where the scorer waits, and the scorer builds that one at its job
    fitness = tiny_fitness(data_dir)
    ctx = EvalContext(seed=0, scratch=tmp_path)
    config = {**CONFIG, "n_layer": 1}
    late = fitness.export_and_score(
        save(tmp_path / "final", seed=1, config=config), tmp_path / "late", ctx
    )
    assert late["status"] == "ok", late
    final = save(tmp_path / "final-again", seed=1, config=config)
    made = early_export(fitness, tmp_path, save(tmp_path / "initial", seed=0), evaldir=final)
    try:
        verdict = fitness.export_and_score(final, tmp_path / "unused", ctx, early=made)
    finally:
        made.close()
    assert verdict["status"] == "ok", verdict
    assert not verdict["graph_from_initial"] and not verdict["graph_built_ahead"], verdict
    assert verdict["val_bpb"] == late["val_bpb"]


def test_a_model_too_large_to_hold_beside_the_training_is_not_built_ahead(
    data_dir, tmp_path, monkeypatch
):
    fitness = tiny_fitness(data_dir)
    final = save(tmp_path / "final", seed=1)
    exported = fitness.export(final, tmp_path / "export", EvalContext(seed=0, scratch=tmp_path))
    assert exported["status"] == "ok", exported
    monkeypatch.chdir(final)
    spec = fitness.scoring_shape()
    program = scorer.load_ahead(spec)
    assert program is not None and program.built_from(final)
    weights = torch.load(final / "model.pt", weights_only=True)
    assert program.shapes() == {name: list(t.shape) for name, t in weights.items()}
    held = sum(t.numel() * t.element_size() for t in weights.values())  # float32, as the graph's
    held += sum(t.numel() * t.element_size() for t in program.constants.values())
    assert program.bound_bytes() == held
    monkeypatch.setattr(scorer, "AHEAD_MAX_BYTES", held)
    assert scorer.load_ahead(spec) is not None
    monkeypatch.setattr(scorer, "AHEAD_MAX_BYTES", held - 1)
    assert scorer.load_ahead(spec) is None
    with (final / "graph.json").open("ab") as graph:  # the same graph, other bytes
        graph.write(b" ")
    assert not program.built_from(final)


def failing_ahead(fitness, tmp_path: Path, evaldir: Path):
    """A scorer started in ``evaldir`` with a graph that fails to build, once it has ended by
    itself before reading a job (a failed forward may leave a GPU unusable), with its own exit
    status; neither finished nor cancelled: a job can still be sent to it."""
    graph = tmp_path / "broken-graph"
    graph.mkdir()
    (graph / "graph.json").write_text('{"graph_module": "not a graph"}')
    torch.save({}, graph / "constants.pt")
    started = fitness.preloaded_scorer(graph, evaldir, EvalContext(seed=0, scratch=tmp_path), ())
    try:
        assert started.proc.wait(timeout=120) == scorer.AHEAD_FAILED
    except BaseException:
        started.cancel()
        raise
    return started


def test_a_job_sent_to_a_scorer_whose_build_ahead_failed_is_scored_by_another(data_dir, tmp_path):
    # the stop can come while the build ahead still runs: the fitness takes that scorer and
    # sends it the job; if the build then fails, the scorer started with the evaluation scores
    fitness = tiny_fitness(data_dir)
    ctx = EvalContext(seed=0, scratch=tmp_path)
    late = fitness.export_and_score(save(tmp_path / "final", seed=1), tmp_path / "late", ctx)
    assert late["status"] == "ok", late
    final = save(tmp_path / "final-again", seed=1)
    made = early_export(fitness, tmp_path, save(tmp_path / "initial", seed=0), evaldir=final)
    made.scorer.cancel()
    made.scorer = failing_ahead(fitness, tmp_path, final)  # as if taken just before it failed
    assert not made.scorer.alive()
    ready = {"scoring": fitness.start_harness("scoring", final, ctx, limit_s=600)}
    try:
        verdict = fitness.export_and_score(final, tmp_path / "unused", ctx, ready, made)
    finally:
        made.close()
    assert isinstance(verdict, dict), verdict.artifacts  # not the failed scorer's error
    assert verdict["status"] == "ok" and verdict["graph_from_initial"], verdict
    assert not verdict["graph_built_ahead"], verdict
    assert verdict["val_bpb"] == late["val_bpb"]
    assert "scoring" not in ready  # the scorer started with the evaluation gave the verdict


def test_a_copy_that_is_not_what_the_harness_was_told_exports_nothing_early(data_dir, tmp_path):
    # the files changed between the program's report and the harness's copy
    fitness = tiny_fitness(data_dir)
    made = early_export(fitness, tmp_path, save(tmp_path / "initial", seed=0), digest="0" * 64)
    assert made.verdict is None and not made.exporter.alive()  # ended, not left waiting
    assert made.graph_for(save(tmp_path / "final", seed=1)) is None


def test_changed_code_or_config_sends_the_export_after_the_stop(data_dir, tmp_path, monkeypatch):
    fitness = tiny_fitness(data_dir)
    made = early_export(fitness, tmp_path, save(tmp_path / "initial", seed=0))
    assert made.verdict["status"] == "ok", made.verdict
    assert made.graph_for(save(tmp_path / "same", seed=1)) is not None
    model_py = (SEED / "model.py").read_text() + "\n# changed after the initial save\n"
    assert made.graph_for(save(tmp_path / "code", seed=1, model_py=model_py)) is None
    config = {**CONFIG, "init_std": 0.03}
    assert made.graph_for(save(tmp_path / "config", seed=1, config=config)) is None
    assert early_module.code_digests(tmp_path / "same") == made.code
