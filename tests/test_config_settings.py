"""Typed settings built once from the config: values carried over, unknown keys and impossible values refused."""

from __future__ import annotations

import subprocess
import sys

import pytest

from evolve.launch.config import build_settings
from evolve.settings import (
    ArchiveSettings,
    BuiltinWeights,
    ConfigError,
    EmitterSettings,
    NoiseSettings,
    SearchSettings,
)
from tests.conftest import REPO, composed


def test_the_default_config_becomes_typed_settings():
    settings = build_settings(composed(["archive.islands=3", "emitter.discount=0.9", "seed=4"]))
    assert settings.archive == ArchiveSettings(
        islands=3, sampler="rank", qd_offset=None, split_depth=1
    )
    assert settings.emitter == EmitterSettings(
        selection="bandit", discount=0.9, exploration=0.5, inspirations=3
    )
    assert settings.search.seed == 4 and isinstance(settings.search, SearchSettings)
    assert settings.noise == NoiseSettings()
    assert settings.builtin.as_dict() == {"tweak": 3.0, "crossover": 1.0}
    assert settings.workers is None and settings.backend == "local" and settings.dry_run is False
    assert settings.benchmark.name == "toy"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "+archive.islnds=2",
            "unknown key(s) ['islnds'] in archive; valid keys: islands, min_improvement, novelty, qd_offset, sampler, split_depth",
        ),
        (
            "+emitter.temperature=1",
            "unknown key(s) ['temperature'] in emitter; valid keys: discount, exploration, inspirations, selection",
        ),
        (
            "+operators.builtin.mutate=1",
            "unknown key(s) ['mutate'] in operators.builtin; valid keys: crossover, tweak",
        ),
        (
            "+archive.novelty.nmes=true",
            "unknown key(s) ['nmes'] in archive.novelty; valid keys: behaviour, constants, "
            "embedding_api_base, embedding_api_key_env, embedding_model, embedding_threshold, names",
        ),
        (
            "archive.novelty.embedding_threshold=2",
            "archive.novelty.embedding_threshold must lie in (0, 1], got 2",
        ),
        ("archive.islands=0", "archive.islands must be an integer >= 1, got 0"),
        ("archive.islands=1.5", "archive.islands must be an integer >= 1, got 1.5"),
        ("archive.sampler=best", "archive.sampler 'best' unknown; choose one of uniform, rank"),
        (
            "emitter.selection=greedy",
            "emitter.selection 'greedy' unknown; choose one of bandit, weights",
        ),
        ("emitter.discount=0", "emitter.discount must lie in (0, 1], got 0"),
        ("emitter.exploration=-1", "emitter.exploration must be >= 0, got -1"),
        ("emitter.inspirations=-2", "emitter.inspirations must be an integer >= 0, got -2"),
        (
            "operators.builtin.tweak=-1",
            "operators.builtin.tweak must be a number >= 0 (0 turns it off), got -1",
        ),
        ("search.max_candidates=0", "search.max_candidates must be a positive integer, got 0"),
        ("search.workers=0", "search.workers must be 'auto' or a positive integer, got 0"),
        ("noise.alpha=2", "noise.alpha must lie in (0, 1), got 2"),
        ("backend.name=slurm", "backend 'slurm' unknown; available: local, ray"),
        ("seed=abc", "seed must be an integer, got 'abc'; e.g. seed=0"),
    ],
)
def test_a_bad_value_is_a_config_error_naming_the_key(override, message):
    with pytest.raises(ConfigError) as raised:
        build_settings(composed([override]))
    assert str(raised.value) == message


def test_an_answer_cap_below_one_token_is_refused_at_start():
    from evolve.llm import LLMConfigError

    with pytest.raises(
        LLMConfigError, match=r"llm.max_tokens must be a whole number of tokens >= 1, got -5"
    ):
        build_settings(composed(["llm.max_tokens=-5"]))


@pytest.mark.parametrize("value", [-1, 0, "soon"])
def test_a_benchmark_timeout_that_is_not_a_positive_number_is_a_config_error(value):
    cfg = composed()
    cfg["benchmark"]["timeout_s"] = value
    with pytest.raises(ConfigError, match=r"benchmark.timeout_s must be"):
        build_settings(cfg)


def test_several_problems_of_one_group_are_reported_together():
    with pytest.raises(ConfigError, match=r"emitter.discount must .*; emitter.exploration must"):
        build_settings(composed(["emitter.discount=5", "emitter.exploration=-1"]))


def test_settings_check_themselves_when_made_directly():
    with pytest.raises(ValueError, match="archive.islands must be an integer >= 1"):
        ArchiveSettings(islands=0)
    with pytest.raises(ValueError, match="operators.builtin.crossover"):
        BuiltinWeights(crossover=-0.5)
    assert EmitterSettings(selection="weights").selection == "weights"


def test_a_fitness_that_cannot_be_built_is_one_config_error():
    with pytest.raises(
        ConfigError,
        match=r"benchmark toy: its fitness .* cannot be built here: .*unexpected keyword",
    ):
        build_settings(composed([], no_such_parameter=1))


def test_alternatives_must_have_their_three_keys():
    cfg = composed([])
    cfg["benchmark"]["alternatives"] = [{"gpus": 0, "args": "benchmark=circle_packing"}]
    with pytest.raises(
        ConfigError,
        match=r"benchmark.alternatives\[0\] must have exactly the keys args, gpus and why",
    ):
        build_settings(cfg)
    cfg["benchmark"]["alternatives"] = [
        {"gpus": 0, "args": "benchmark=circle_packing seed=1", "why": "here"}
    ]
    assert build_settings(cfg).alternatives[0].args == ("benchmark=circle_packing", "seed=1")


def test_the_config_layer_does_not_import_the_loop():
    code = (
        "import sys, evolve.launch.config, evolve.settings\n"
        "loop = ('evolve.search.engine', 'evolve.search.driver', 'evolve.launch.runner', 'evolve.backends')\n"
        "print(sorted(m for m in sys.modules if m.startswith(loop)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_a_resume_restating_the_runs_own_group_choice_is_accepted_and_another_refused():
    from evolve.launch.config import compose, merge_resumed

    stored = compose(["llm=local", "llm.model=openai/coder"])
    merged = merge_resumed(stored, ["llm=local", "llm.model=openai/coder"])
    assert merged["llm"] == stored["llm"]
    with pytest.raises(ConfigError, match=r"cannot change \['llm=command'\]"):
        merge_resumed(stored, ["llm=command"])
