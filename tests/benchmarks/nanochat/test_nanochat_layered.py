"""The quick stages of the nanochat fitness: broken candidates stop at the cheap stage that catches them.

Each case runs the CPU seed, or a variant, through the real probe, supervisor and sandbox on
the tiny dataset. The module's fitness measures the seed's references once (the local check's
values, and the short run's loss band over three seeds) and keeps them for every test.
"""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import pytest
import yaml
from evolve.benchmarks.nanochat import scales, stages

from evolve.harness.clock import Watch, Window
from evolve.harness.fitness import EvalContext, evaluate_safely
from evolve.harness.hashing import harness_modules
from evolve.types import EvalStatus
from tests.fixtures.nanochat_tiny import tiny_fitness

SEED = scales.SCALES["cpu"].seed_dir
CONFIG = Path(__file__).resolve().parents[3] / "configs" / "benchmark" / "nanochat.yaml"
TOOLS = {"__init__.py", "gpu_run.py", "stage_cost.py"}  # not part of the measurement
ANCHOR = "torch.manual_seed(settings.seed)\n"
SHORT_RUN_STEPS = 20


@pytest.fixture(scope="module")
def fitness(data_dir):
    return tiny_fitness(data_dir, layered={"local_check": True, "short_run_steps": SHORT_RUN_STEPS})


def candidate(tmp_path: Path, edits: dict[str, list[tuple[str, str]]] | None = None) -> Path:
    """The CPU seed in a fresh folder, with each (old, new) replacement applied (old must occur)."""
    work = tmp_path / "work"
    work.mkdir()
    for path in SEED.glob("*.py"):
        text = path.read_text()
        for old, new in (edits or {}).get(path.name, []):
            assert old in text, old
            text = text.replace(old, new)
        (work / path.name).write_text(text)
    return work


def evaluate(fitness, work: Path, tmp_path: Path, seed: int = 0):
    return evaluate_safely(fitness, work, EvalContext(seed=seed, scratch=tmp_path))


def local_check(fitness, work: Path, tmp_path: Path):
    """The local check stage alone."""
    stage = fitness.stages[0]
    assert stage.name == "local_check"
    return stage.run(work, EvalContext(seed=0, scratch=tmp_path))


def test_the_seed_passes_both_quick_stages_then_is_scored(fitness, tmp_path):
    ev = evaluate(fitness, candidate(tmp_path), tmp_path, seed=3)
    assert ev.ok and ev.stage == "full", dict(ev.artifacts)
    assert ev.metrics["local_check_ok"] == 1
    assert ev.metrics["short_run_loss"] <= ev.metrics["short_run_band_upper"]
    assert 1.0 < ev.fitness < 12.0


def test_nan_outputs_stop_at_the_local_check(fitness, tmp_path):
    nan = {
        "model.py": [
            (
                "return self.lm_head(self.norm_out(x))",
                "return self.lm_head(self.norm_out(x)) * float('nan')",
            )
        ]
    }
    ev = evaluate(fitness, candidate(tmp_path, nan), tmp_path)
    assert ev.status == EvalStatus.INVALID and ev.stage == "local_check"
    assert "non-finite values (NaN or inf)" in ev.artifacts["error"]


def test_a_model_that_sees_the_future_stops_at_the_local_check(fitness, tmp_path):
    peek = {"model.py": [("is_causal=True", "is_causal=False")]}
    ev = evaluate(fitness, candidate(tmp_path, peek), tmp_path)
    assert ev.status == EvalStatus.INVALID and ev.stage == "local_check"
    assert "local check: causality is" in ev.artifacts["error"]
    assert "must be ~0" in ev.artifacts["error"]


# The head's weight stored 1e4 times smaller and multiplied by 1e4 in forward: the same
# outputs, 1e4 times larger gradients; only the gradient norms can tell.
HIDDEN_SCALE = [
    (
        "return self.lm_head(self.norm_out(x))",
        "return F.linear(self.norm_out(x), self.lm_head.weight * 1e4)",
    ),
    (
        "    def forward(self, idx",
        "        self.lm_head.weight.data /= 1e4\n\n    def forward(self, idx",
    ),
]
PLAIN_SCALE = [
    (
        "                nn.init.normal_(param, std=std)\n",
        "                nn.init.normal_(param, std=std)\n        self.lm_head.weight.data *= 1e4\n",
    )
]


@pytest.mark.parametrize(
    "edits, reason",
    [(HIDDEN_SCALE, "grad_norm_vocab has scale"), (PLAIN_SCALE, "local check: loss has scale")],
    ids=["same-outputs", "outputs-too"],
)
def test_exploding_gradients_stop_at_the_local_check(fitness, tmp_path, edits, reason):
    ev = evaluate(fitness, candidate(tmp_path, {"model.py": edits}), tmp_path)
    assert ev.status == EvalStatus.INVALID and ev.stage == "local_check"
    assert reason in ev.artifacts["error"]


def test_a_zero_initialised_head_passes_the_local_check(fitness, tmp_path):
    zero = {
        "model.py": [
            (
                "                nn.init.normal_(param, std=std)\n",
                "                nn.init.normal_(param, std=std)\n        nn.init.zeros_(self.lm_head.weight)\n",
            )
        ]
    }
    ev = local_check(fitness, candidate(tmp_path, zero), tmp_path)  # body gradients are 0 at first
    assert ev.ok, dict(ev.artifacts)


def test_reading_validation_data_while_building_stops_at_the_local_check(fitness, tmp_path):
    peek = (
        "import pathlib\ntry:\n    (pathlib.Path(next(p for p in __import__('json').loads(__import__('os').environ['NANOCHAT_CONFIG'])['forbidden'] if p.endswith('val'))) / 'tokens.bin').read_bytes()\n"
        "except OSError:\n    pass\n"
    )
    ev = evaluate(fitness, candidate(tmp_path, {"train.py": [(ANCHOR, ANCHOR + peek)]}), tmp_path)
    assert ev.status == EvalStatus.REJECTED and ev.stage == "local_check"
    assert "forbidden" in ev.artifacts["error"]


def test_a_process_left_running_by_train_py_stops_at_the_local_check(fitness, tmp_path):
    spawn = "import subprocess\nsubprocess.Popen(['sleep', '120'], start_new_session=True)\n"
    ev = evaluate(fitness, candidate(tmp_path, {"train.py": [(ANCHOR, ANCHOR + spawn)]}), tmp_path)
    assert ev.status == EvalStatus.REJECTED and ev.stage == "local_check"
    assert "left 1 process(es) running" in ev.artifacts["error"]


def test_a_diverging_learning_rate_stops_at_the_short_run(fitness, tmp_path):
    ev = evaluate(
        fitness, candidate(tmp_path, {"train.py": [("LR = 0.001", "LR = 1.0")]}), tmp_path
    )
    assert ev.status == EvalStatus.INVALID and ev.stage == "short_run"
    assert ev.metrics["local_check_ok"] == 1
    error = ev.artifacts["error"]
    assert f"at step {SHORT_RUN_STEPS - 1} is above the seed's band (mean" in error
    assert "limit" in error and ev.metrics["short_run_loss"] > 10


def test_a_training_program_that_reports_no_loss_stops_at_the_short_run(fitness, tmp_path):
    silent = {"train.py": [("x.numel(), loss=loss.item())", "x.numel())")]}
    ev = evaluate(fitness, candidate(tmp_path, silent), tmp_path)
    assert ev.status == EvalStatus.INVALID and ev.stage == "short_run"
    assert "clock.step(tokens=..., loss=loss.item())" in ev.artifacts["error"]


def test_an_honest_refactor_passes_every_stage(fitness, tmp_path):
    refactor = {
        "model.py": [
            ("token_embedding", "wte"),
            ("position_embedding", "wpe"),
            (  # the head and final norm registered first (another parameter order and init draw)
                "        self.wte = nn.Embedding(vocab_size, n_embd)\n",
                "        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)\n"
                "        self.norm_out = nn.LayerNorm(n_embd)\n"
                "        self.wte = nn.Embedding(vocab_size, n_embd)\n",
            ),
            (
                "        self.norm_out = nn.LayerNorm(n_embd)\n        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)\n        for name",
                "        for name",
            ),
            (
                "        x = x + self.attn(self.norm_attn(x))\n        return x + self.mlp(self.norm_mlp(x))",
                "        attended = x + self.attn(self.norm_attn(x))\n        return attended + self.mlp(self.norm_mlp(attended))",
            ),
        ],
        "train.py": [("batches = client", "stream = client"), ("next(batches, None)", "next(stream, None)")],
    }
    ev = evaluate(fitness, candidate(tmp_path, refactor), tmp_path, seed=5)
    assert ev.ok and ev.stage == "full", dict(ev.artifacts)


def test_the_supervisor_stops_a_short_run_after_its_steps_and_keeps_the_losses():
    window = Window(untimed_steps=11, max_steps=3, startup_limit_s=60.0, budget_s=15.0,
                    free_startup_s=60.0, finish_limit_s=5.0, save_floor_s=0.5)  # fmt: skip
    watch = Watch(window, start=0.0)
    for step, loss in ((1, " 7.5"), (2, " nan"), (3, "")):
        watch.on_line(f"step {step} 1024{loss}", now=float(step))
        assert watch.check(float(step)) == ("stop" if step == 3 else None)
    assert watch.losses[0] == 7.5 and math.isnan(watch.losses[1]) and watch.losses[2] is None
    watch.stop_sent_at = 3.0
    watch.on_line("saved", now=3.5)
    assert watch.check(7.9) is None and watch.check(8.1) == "kill"
    assert "after the harness said stop" in watch.verdict[1]


def test_layered_settings_defaults_errors_and_pickling(data_dir, fitness):
    cpu = scales.SCALES["cpu"]
    assert stages.LayeredSettings.of(None, cpu) == stages.LayeredSettings(
        local_check=True, short_run_steps=stages.SHORT_RUN_STEPS["cpu"]
    )
    with pytest.raises(ValueError, match="known: \\['local_check', 'short_run_steps'\\]"):
        stages.LayeredSettings.of({"short_runs": 5}, cpu)
    with pytest.raises(ValueError, match="0 \\(no short run\\) or more, got -1"):
        stages.LayeredSettings.of({"short_run_steps": -1}, cpu)
    off = tiny_fitness(data_dir)  # the fixture turns both off
    assert [s.name for s in off.stages] == ["full"]
    assert [s.name for s in fitness.stages] == ["local_check", "short_run", "full"]
    assert fitness.benchmark_overrides["timeout_s"] > off.benchmark_overrides["timeout_s"]
    clone = pickle.loads(pickle.dumps(fitness))  # workers get the fitness pickled
    assert clone.stages[0].run.probe.fitness is clone


def test_the_harness_hash_covers_every_harness_module_and_the_config_turns_the_local_check_on():
    hashed = set(harness_modules("evolve.benchmarks.nanochat.fitness"))
    modules = {path for path in scales.HERE.glob("*.py") if path.name not in TOOLS}
    assert {"probe.py", "probe_worker.py", "stages.py"} <= {p.name for p in modules}
    assert modules <= hashed
    layer = Path(harness_modules.__code__.co_filename).parent
    assert {layer / n for n in ("lm.py", "clock.py", "stream.py", "protocol.py")} <= hashed
    assert scales.HERE / "layered.py" in hashed
    config = yaml.safe_load(CONFIG.read_text())
    assert config["fitness"]["layered"] == {"local_check": True, "short_run_steps": None}
