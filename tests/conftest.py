"""Shared test helpers: composing configs through Hydra, running evolve in a subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from evolve.launch.config import as_dict

REPO = Path(__file__).resolve().parents[1]
TOY_BENCHMARK = REPO / "tests" / "fixtures" / "evolve_configs" / "benchmark" / "toy.yaml"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """As root, the session's temp folders live in a folder of its own: sandboxed commands run
    as another uid (``evolve.sandbox.identity``), which the sandbox lets reach the test folders they are
    given, and pytest takes every permission for others off ``/tmp/pytest-of-root`` at each
    session's start, cutting off those of a session running beside it."""
    if config.option.basetemp is None and os.geteuid() == 0:
        config.option.basetemp = Path(tempfile.mkdtemp(prefix="pytest-evolve-")) / "session"


def pytest_unconfigure(config: pytest.Config) -> None:
    basetemp = config.option.basetemp
    if basetemp is not None and Path(basetemp).parent.name.startswith("pytest-evolve-"):
        shutil.rmtree(Path(basetemp).parent, ignore_errors=True)


def composed(overrides: list[str] = (), *, toy: bool = True, **benchmark_fitness: Any) -> dict[str, Any]:
    """The resolved config of ``python -m evolve <overrides>`` (with the toy benchmark by default)."""
    with initialize_config_module(config_module="evolve.configs", version_base=None):
        cfg = as_dict(compose(config_name="config", overrides=list(overrides)))
    if toy:
        cfg["benchmark"] = as_dict(OmegaConf.load(TOY_BENCHMARK))
        cfg["benchmark"]["fitness"].update(benchmark_fitness)
    cfg["search"]["progress"] = False
    return cfg


def evolve_cli(*args: str, cwd: Path = REPO, timeout: float = 300, **popen: Any) -> subprocess.CompletedProcess:
    """Run ``python -m evolve ARGS`` in a subprocess and return its completed process."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HYDRA_FULL_ERROR": "0"}
    return subprocess.run(
        [sys.executable, "-m", "evolve", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, **popen
    )


def start_evolve(args: list[str], run_dir: Path) -> subprocess.Popen:
    """Start ``ARGS hydra.run.dir=RUN_DIR`` (a ``python -m evolve`` command line) in its own
    process group, quietly, to be killed with ``os.killpg``."""
    return subprocess.Popen(
        [*args, f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


@pytest.fixture
def toy_cfg():
    return composed


@pytest.fixture(params=["cgroup", "affinity"])
def mode(request, monkeypatch) -> str:
    """A CPU-allowance test runs with this machine's cpuset cgroups, and again as on a machine
    without them (``evolve.sandbox.cores``' affinity fallback)."""
    from evolve.sandbox import cores

    if request.param == "affinity":
        monkeypatch.setattr(cores, "CGROUP_MOUNTS", ())
    elif cores.plan().cgroup is None:
        pytest.skip(f"no writable cpuset cgroup here: {cores.plan().why_not}")
    return request.param
