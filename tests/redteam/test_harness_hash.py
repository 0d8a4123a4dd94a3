"""Harness files are hashed at run start and checked before every evaluation and on resume."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from evolve.harness.fitness import Benchmark
from evolve.harness.hashing import harness_modules
from evolve.launch import runner
from evolve.paths import resolve_path
from evolve.search.jobs import HarnessChanged
from evolve.store.database import Store
from evolve.types import CandidateStatus
from tests.conftest import REPO, composed

HARNESS_TEXT = "# the toy's harness\nTARGET = 3\n"


def tampering_cfg(tmp_path: Path, budget: int = 30):
    harness, counter = tmp_path / "harness.py", tmp_path / "count"
    harness.write_text(HARNESS_TEXT)
    cfg = composed([f"search.max_candidates={budget}", "search.workers=1"])
    cfg["benchmark"]["fitness"] = {
        "_target_": "tests.redteam.tamper.TamperingToy",
        "harness": str(harness),
        "counter": str(counter),
        "at": 5,
    }
    cfg["benchmark"]["harness"] = [str(harness)]
    return cfg, harness


def test_a_harness_changed_mid_run_stops_it_and_resume_refuses_until_restored(tmp_path):
    cfg, harness = tampering_cfg(tmp_path)
    run_dir = tmp_path / "run"
    with pytest.raises(HarnessChanged, match="changed during the run"):
        runner.run(cfg, run_dir)
    store = Store(run_dir / "archive.db")
    assert store.integrity_problems() == []
    evaluated = store.count(CandidateStatus.DONE) + store.count(CandidateStatus.FAILED)
    assert evaluated == 5  # the 5th evaluation changed the file; the 6th never started
    assert store.conn.execute("SELECT status FROM runs").fetchone()[0] == "interrupted"
    store.close()
    with pytest.raises(HarnessChanged, match="differ from those the run started with"):
        runner.run(cfg, run_dir, resumed=True)
    harness.write_text(HARNESS_TEXT)  # restored: the run continues to its budget
    summary = runner.run(cfg, run_dir, resumed=True)
    assert summary.evaluated == 30
    store = Store(run_dir / "archive.db")
    assert store.integrity_problems() == []
    hashes = {row[0] for row in store.conn.execute("SELECT harness_hash FROM runs")}
    assert len(hashes) == 2  # the refused resume recorded the changed hash; the others the original


# --- every benchmark config names the files that define its measurement ----------------------

CONFIGS = sorted((REPO / "configs" / "benchmark").glob("*.yaml"))
SEED_DIRS = {"seed", "seeds"}


def benchmark_config(path: Path) -> dict:
    """A benchmark config with its ``defaults`` (other benchmark configs) merged in."""
    data = yaml.safe_load(path.read_text())
    merged: dict = {}
    for parent in data.pop("defaults", []) or []:
        if isinstance(parent, str) and parent != "_self_":
            merged.update(benchmark_config(path.parent / f"{parent}.yaml"))
    merged.update(data)
    return merged


def package_imports(package: Path, module: str) -> set[str]:
    """Modules of ``package`` that ``module`` imports or runs (``-m pkg.mod`` strings), transitively."""
    name = package.name
    prefix = f"evolve.benchmarks.{name}."
    seen, todo = set(), [module]
    while todo:
        current = todo.pop()
        if current in seen or not (package / f"{current}.py").is_file():
            continue
        seen.add(current)
        tree = ast.parse((package / f"{current}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = ("." * node.level) + (node.module or "")
                if node.level == 1:
                    todo += [base[1:]] if node.module else [a.name for a in node.names]
                elif base == f"evolve.benchmarks.{name}":
                    todo += [a.name for a in node.names]
                elif base.startswith(prefix):
                    todo.append(base[len(prefix) :].split(".")[0])
            elif isinstance(node, ast.Import):
                todo += [
                    a.name[len(prefix) :].split(".")[0]
                    for a in node.names
                    if a.name.startswith(prefix)
                ]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                todo += [
                    m.split(".")[0] for m in re.findall(rf"{re.escape(prefix)}(\w+)", node.value)
                ]
    return seen


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_benchmark_configs_hash_every_harness_module(path):
    cfg = benchmark_config(path)
    listed = [resolve_path(p) for p in cfg.get("harness") or []]
    missing = [str(p) for p in listed if not p.is_file()]
    assert not missing, f"{path.name}: harness files that do not exist: {missing}"
    target = cfg["fitness"]["_target_"]
    if not target.startswith("evolve.benchmarks."):
        return
    package = resolve_path(f"pkg://evolve.benchmarks.{target.split('.')[2]}")
    fitness_module = target.rsplit(".", 1)[0]
    needed = {package / f"{m}.py" for m in package_imports(package, fitness_module.split(".")[3])}
    hashed = {p.resolve() for p in listed} | set(harness_modules(fitness_module))
    unhashed = sorted(str(p.relative_to(package)) for p in needed if p.resolve() not in hashed)
    assert not unhashed, (
        f"{path.name}: the fitness imports or runs {unhashed}, which the harness hash misses"
    )
    assert (REPO / "evolve" / "sandbox" / "process.py").resolve() in hashed


# --- the hash is computed from the imports, not listed by hand -----------------------------------


def toy_package(root: Path) -> Path:
    """A fitness package whose fitness imports a helper and starts a worker with ``-m``."""
    package = root / "toyharness"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "fitness.py").write_text(
        "from toyharness import helper\n"
        "WORKER = 'toyharness.worker'\n"
        "class Toy:\n    objective = None\n    descriptors = ()\n"
        "    def evaluate(self, workdir, ctx):\n        return helper.score()\n"
    )
    (package / "helper.py").write_text(
        "from evolve.harness import lm\ndef score():\n    return 1\n"
    )
    (package / "worker.py").write_text("LIMIT = 1\n")
    return package


def test_changing_any_module_the_fitness_imports_or_starts_changes_the_hash(tmp_path, monkeypatch):
    package = toy_package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    from toyharness.fitness import Toy

    bench = Benchmark(name="toy", fitness=Toy(), seed_dir=tmp_path)
    paths = set(bench.harness_paths())
    assert {package / "fitness.py", package / "helper.py", package / "worker.py"} <= paths
    assert (REPO / "evolve" / "harness" / "lm.py").resolve() in paths  # imported by the helper
    assert (REPO / "evolve" / "fitness.py").resolve() not in paths  # not imported by this toy
    before = bench.harness_hash()
    for name in ("helper.py", "worker.py"):
        original = (package / name).read_text()
        (package / name).write_text(original + "# changed\n")
        assert bench.harness_hash() != before, name
        (package / name).write_text(original)
        assert bench.harness_hash() == before


def test_the_layered_checks_and_the_harness_layer_are_hashed_for_nanochat():
    hashed = set(harness_modules("evolve.benchmarks.nanochat.fitness"))
    layer = REPO / "evolve" / "harness"
    assert (REPO / "benchmarks" / "nanochat" / "layered.py").resolve() in hashed
    for name in ("lm.py", "clock.py", "stream.py", "protocol.py", "reaper.py"):
        assert (layer / name).resolve() in hashed, name
