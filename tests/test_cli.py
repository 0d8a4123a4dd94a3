"""``python -m evolve`` as a user meets it: help, custom fitness, bad input, an installed copy."""

import os
import re
import shutil
import sqlite3
import subprocess
import sys

import pytest

from evolve.store import runlock
from evolve.store.database import Store
from tests.conftest import REPO, evolve_cli

FAST = ["search.max_candidates=6", "search.progress=false"]


def test_help_lists_the_groups_and_options():
    result = evolve_cli("--help")
    assert result.returncode == 0
    for word in ("benchmark:", "circle_packing", "llm:", "search:", "max_candidates", "resume", "evolve_configs"):
        assert word in result.stdout


def test_default_run_says_it_uses_the_builtin_operators(tmp_path):
    result = evolve_cli(*FAST, f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert "built-in operators" in result.stdout + result.stderr
    assert "run finished" in result.stdout
    assert Store(tmp_path / "archive.db").integrity_problems() == []
    assert (tmp_path / ".hydra" / "config.yaml").exists() and (tmp_path / "evolve.log").exists()


def test_a_fitness_from_a_test_module_runs_with_one_override(tmp_path):
    result = evolve_cli(*FAST, f"hydra.run.dir={tmp_path}", "benchmark.fitness._target_=tests.fixtures.custom_fitness.MinRadius")
    assert result.returncode == 0, result.stderr
    store = Store(tmp_path / "archive.db")
    best = store.conn.execute("SELECT fitness, metrics FROM evaluations WHERE status='ok' ORDER BY fitness DESC").fetchone()
    assert best[0] < 0.2  # a min radius, not a sum of 26 radii


def test_a_benchmark_from_the_users_config_directory_runs_with_one_override(tmp_path):
    shutil.copytree(REPO / "tests" / "fixtures" / "evolve_configs", tmp_path / "evolve_configs")
    result = evolve_cli("benchmark=toy", *FAST, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "archives" / "toy").glob("*/archive.db"))


def test_unknown_benchmark_lists_the_available_ones():
    result = evolve_cli("benchmark=circle_pakcing")
    assert result.returncode != 0
    assert "circle_packing" in result.stderr and "Available options" in result.stderr


def test_a_standard_library_target_is_refused(tmp_path):
    result = evolve_cli(*FAST, f"hydra.run.dir={tmp_path}", "benchmark.fitness._target_=os.system")
    assert result.returncode != 0 and "not allowed" in result.stderr


def test_resume_of_a_missing_directory_names_the_fix(tmp_path):
    result = evolve_cli(f"resume={tmp_path / 'nope'}")
    assert result.returncode == 2 and "no archive.db there" in result.stderr
    assert not (tmp_path / "nope").exists()


@pytest.mark.parametrize("content", [b"garbage" * 500, "foreign"])
def test_corrupt_or_foreign_archive_is_refused_and_left_untouched(tmp_path, content):
    path = tmp_path / "archive.db"
    if content == "foreign":
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE t (x)")
        conn.commit()
        conn.close()
    else:
        path.write_bytes(content)
    before = path.read_bytes()
    result = evolve_cli(f"resume={tmp_path}")
    assert result.returncode != 0
    assert "not an evolve archive" in result.stderr or "not a readable SQLite archive" in result.stderr
    assert path.read_bytes() == before


def test_resume_refuses_a_different_benchmark(tmp_path):
    assert evolve_cli(*FAST, f"hydra.run.dir={tmp_path}").returncode == 0
    result = evolve_cli(f"resume={tmp_path}", "benchmark.fitness.n_circles=10")
    assert result.returncode != 0 and "cannot change" in result.stderr


def test_a_plain_resume_keeps_the_budget_given_at_the_last_resume(tmp_path):
    assert evolve_cli("search.max_candidates=3", "search.progress=false", f"hydra.run.dir={tmp_path}").returncode == 0
    raised = evolve_cli(f"resume={tmp_path}", "search.max_candidates=5", "search.progress=false")
    assert raised.returncode == 0 and "reached search.max_candidates=5" in raised.stdout
    again = evolve_cli(f"resume={tmp_path}", "search.progress=false")
    assert again.returncode == 0 and "reached search.max_candidates=5): 5 evaluated" in again.stdout


def test_a_new_run_in_a_used_directory_is_refused_with_the_resume_command(tmp_path):
    assert evolve_cli(*FAST, f"hydra.run.dir={tmp_path}").returncode == 0
    result = evolve_cli(*FAST, f"hydra.run.dir={tmp_path}", "seed=5")
    assert result.returncode != 0 and f"continue it with resume={tmp_path}" in result.stderr


@pytest.mark.parametrize("argument", ["hydra.run.dir", "resume"])
def test_a_start_refused_by_a_live_run_touches_nothing_in_its_directory(tmp_path, argument):
    assert evolve_cli(*FAST, f"hydra.run.dir={tmp_path}").returncode == 0
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p.name != runlock.LOCK_NAME}
    with runlock.hold(tmp_path):  # this process plays the live run
        result = evolve_cli(*FAST, f"{argument}={tmp_path}", "seed=5")
    assert result.returncode == 2 and "error:" in result.stderr and "in use by evolve pid" in result.stderr
    assert "Traceback" not in result.stderr
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p.name != runlock.LOCK_NAME}
    assert after == before  # .hydra/overrides.yaml above all: Hydra never ran


def test_a_non_editable_install_runs_from_another_directory(tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target), str(REPO)],
        check=True, capture_output=True,
    )
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    env_path = f"{target}"
    check = subprocess.run(
        [sys.executable, "-c", "import evolve; print(evolve.__file__)"],
        cwd=workdir, capture_output=True, text=True, env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
    )
    assert str(target) in check.stdout
    result = subprocess.run(
        [sys.executable, "-m", "evolve", *FAST],
        cwd=workdir, capture_output=True, text=True, env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"}, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert list((workdir / "archives" / "circle_packing").glob("*/archive.db"))


def test_a_benchmarks_search_defaults_apply_unless_overridden():
    from evolve.launch.config import with_benchmark_search_defaults

    cfg = {"benchmark": {"search": {"max_wall_s": 450}}, "search": {"max_wall_s": None, "max_candidates": 300}}
    assert with_benchmark_search_defaults(cfg, [])["search"]["max_wall_s"] == 450
    assert with_benchmark_search_defaults(cfg, ["search.max_wall_s=60"])["search"]["max_wall_s"] is None


# --- start errors: one message naming the fix, exit status 2 -----------------------------------

BENCHMARK_CONFIGS = sorted(p.stem for p in (REPO / "configs" / "benchmark").glob("*.yaml"))


def without_gpus(*args: str, tmp_path) -> subprocess.CompletedProcess:
    """``python -m evolve ARGS dry_run=true`` with every GPU hidden, in its own run directory."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HYDRA_FULL_ERROR": "0", "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(
        [sys.executable, "-m", "evolve", *args, "dry_run=true", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )


@pytest.mark.parametrize("benchmark", BENCHMARK_CONFIGS)
def test_each_shipped_benchmark_starts_or_says_what_works_without_gpus(benchmark, tmp_path):
    result = without_gpus(f"benchmark={benchmark}", tmp_path=tmp_path)
    output = result.stdout + result.stderr
    assert "Traceback" not in output
    if result.returncode == 0:
        assert "dry run: the config is valid" in result.stdout
        assert not (tmp_path / "run" / "archive.db").exists()  # nothing written, nothing evaluated
        return
    assert result.returncode == 2, output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "none is visible here (CUDA_VISIBLE_DEVICES='')" in errors[0], output
    assert "What works here" in errors[0] or "run it on a machine with" in errors[0]


def test_speedrun_without_gpus_names_the_cpu_scale_as_the_command_that_works(tmp_path):
    result = without_gpus("benchmark=speedrun", "seed=3", tmp_path=tmp_path)
    assert result.returncode == 2
    assert "benchmark speedrun needs 8 GPU(s) per evaluation, but none is visible here" in result.stderr
    offered = [line.strip() for line in result.stderr.splitlines() if line.strip().startswith("python -m evolve")]
    assert offered == ["python -m evolve benchmark=speedrun_cpu seed=3 dry_run=true"]


def _settings(*overrides: str):
    from evolve.launch.config import build_settings
    from tests.conftest import composed

    return build_settings(composed(list(overrides), toy=False))


def test_fewer_gpus_than_the_full_scale_offer_gradient_accumulation_first():
    from evolve.cli import HardwareError, check_gpus

    settings = _settings("benchmark=speedrun")
    assert settings.benchmark.gpus == 8

    def offered(found: int, overrides=("benchmark=speedrun", "llm=openai")) -> list[str]:
        with pytest.raises(HardwareError) as raised:
            check_gpus("speedrun", 8, settings.alternatives, list(overrides), found=(found, "test"))
        return [line.strip() for line in str(raised.value).splitlines() if line.strip().startswith("python")]

    four = offered(4)
    assert four[0] == (
        "python -m evolve benchmark=speedrun benchmark.gpus=4 benchmark.fitness.nproc_per_node=4 "
        "benchmark.fitness.run_timeout_s=8400 benchmark.timeout_s=28800 llm=openai"
    )
    assert len(four) == 5  # 4 and 2 GPUs with accumulation, the one-GPU scale, 1 GPU with accumulation, CPU
    one = offered(1, ("benchmark=speedrun", "benchmark.fitness.data_dir=/data", "seed=2"))
    assert one[0] == "python -m evolve benchmark=speedrun_1gpu seed=2"  # another benchmark: its own data
    assert "benchmark.fitness.data_dir=/data" in one[1] and "nproc_per_node=1" in one[1]
    assert offered(0) == ["python -m evolve benchmark=speedrun_cpu llm=openai"]
    check_gpus("speedrun", 8, settings.alternatives, [], found=(8, "test"))  # enough: no error


def test_every_accumulation_alternative_splits_the_seeds_batch():
    """The seed's full preset needs total_batch = micro_batch x seq_len x GPUs x accum, accum whole."""
    settings = _settings("benchmark=speedrun")
    widths = [
        int(arg.split("=")[1])
        for alt in settings.alternatives
        for arg in alt.args
        if arg.startswith("benchmark.fitness.nproc_per_node=")
    ]
    assert widths == [4, 2, 1]
    total_batch, micro_batch, seq_len = 524288, 64, 1024  # benchmarks/speedrun/seed/train.py PRESETS["full"]
    assert all(total_batch % (micro_batch * seq_len * w) == 0 for w in widths)


def test_a_config_error_is_one_line_with_exit_status_2(tmp_path):
    result = evolve_cli("archive.islands=0", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 2
    assert result.stderr.strip() == "error: archive.islands must be an integer >= 1, got 0"
    assert not (tmp_path / "archive.db").exists()


def test_evolve_run_from_python_refuses_a_bad_config_with_the_same_message(tmp_path):
    import evolve
    from evolve.settings import ConfigError

    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['bogus'\] in emitter; valid keys: discount"):
        evolve.run(["+emitter.bogus=1"], run_dir=tmp_path)
    assert not (tmp_path / "archive.db").exists()


def test_evolve_run_from_python_runs_a_search(tmp_path):
    import evolve

    summary = evolve.run(["search.max_candidates=3", "search.progress=false", "search.workers=1"], run_dir=tmp_path)
    assert summary.evaluated == 3 and summary.best is not None
    assert Store(tmp_path / "archive.db").count() >= 3


def test_an_llm_config_error_is_found_before_anything_is_written(tmp_path):
    result = evolve_cli("llm.timeout_s=0", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 2
    assert result.stderr.strip() == "error: llm.timeout_s must be > 0, got 0"
    assert not (tmp_path / "archive.db").exists()


def test_a_typo_in_a_key_exits_2_naming_the_valid_keys(tmp_path):
    result = evolve_cli("archive.islnds=3", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        "error: unknown key(s) ['islnds'] in archive; valid keys: "
        "islands, min_improvement, novelty, qd_offset, sampler, split_depth"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad", ["benchmark=circle_pakcing", "archive.islands=[", "seed=${nope}"])
def test_hydras_own_errors_are_one_error_line_with_exit_status_2(bad, tmp_path):
    result = evolve_cli(bad, cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr and "HYDRA_FULL_ERROR" not in result.stderr


@pytest.mark.parametrize(
    "args", [["archive.islands=0"], ["dry_run=true"], ["llm=openai", "llm.api_key_env=EVOLVE_TEST_NO_SUCH_KEY"]]
)
def test_a_failed_start_or_a_dry_run_leaves_no_run_directory(args, tmp_path):
    result = evolve_cli(*args, cwd=tmp_path)
    assert result.returncode == (0 if args == ["dry_run=true"] else 2), result.stderr
    assert list(tmp_path.iterdir()) == []  # not even archives/


def test_the_final_lines_round_the_scores_and_say_how_to_go_on(tmp_path):
    result = evolve_cli("search.max_candidates=3", "search.progress=false", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    scores = next(line for line in result.stdout.splitlines() if line.startswith("seed "))
    assert re.fullmatch(r"seed [\d.]{1,7}  ->  best [\d.]{1,7} \(\w+\)", scores), scores
    assert f"go on with a larger budget: python -m evolve resume={tmp_path} search.max_candidates=6" in result.stdout


def test_a_sweep_ends_with_an_overview_of_its_runs(tmp_path):
    result = evolve_cli("-m", "seed=0,1", "search.max_candidates=2", "search.progress=false", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    overview = result.stdout[result.stdout.index("sweep of 2 run(s):") :].splitlines()[1:]
    runs = sorted((tmp_path / "archives" / "sweeps").glob("*/*/archive.db"))
    assert len(overview) == 2 and len(runs) == 2
    assert overview[0].strip().startswith("seed=0 ") and str(runs[0].parent) in overview[0]
