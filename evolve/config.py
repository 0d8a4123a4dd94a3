"""The only module that knows Hydra: config schemas, path resolution, and safe instantiation.

Configs are YAML groups under ``evolve/configs`` (the repository's ``configs/``). Every
``_target_`` is checked before it is imported: it must lie under an allowed module prefix
(``evolve.`` and ``config.allow_targets``) or resolve to a class that implements the
protocol its key requires (a ``fitness`` must have ``evaluate``). So a config file, or a
resumed archive's stored config, cannot instantiate arbitrary callables such as
``os.system``.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import importlib.resources
import inspect
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from evolve.fitness import Benchmark, Fitness
from evolve.settings import SearchSettings
from evolve.types import EvolveError

ALWAYS_ALLOWED = ("evolve.",)
DENIED_MODULES = (
    "os",
    "subprocess",
    "builtins",
    "shutil",
    "sys",
    "importlib",
    "pty",
    "socket",
    "ctypes",
    "eval",
)
RESUME_OVERRIDABLE = (
    "search.", "backend.", "llm.max_cost_usd", "resume", "hydra.", "progress",
    "llm.offline", "llm.replay_from", "llm.timeout_s", "llm.retries", "llm.api_base",
)


class ConfigError(EvolveError):
    """A configuration the run cannot use; the message names the fix."""


# --- paths ----------------------------------------------------------------------------------------


def resolve_path(spec: str | Path, *, base: Path | None = None) -> Path:
    """Resolve ``pkg://package.module/relative/path`` or a filesystem path (relative to ``base`` or cwd)."""
    text = str(spec)
    if text.startswith("pkg://"):
        module, _, rel = text.removeprefix("pkg://").partition("/")
        try:
            root = importlib.resources.files(module)
        except ModuleNotFoundError as exc:
            raise ConfigError(f"path {text!r}: package {module!r} is not importable") from exc
        return Path(str(root.joinpath(rel))) if rel else Path(str(root))
    path = Path(text).expanduser()
    return path if path.is_absolute() else (base or Path.cwd()) / path


def new_run_dir(resume: str | None, benchmark: str) -> str:
    """Hydra resolver ``evolve_run_dir``: the resume directory, or archives/<benchmark>/<timestamp>."""
    if resume:
        return str(Path(resume).expanduser().resolve())
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    path, number = Path("archives") / benchmark / stamp, 1
    while path.exists():  # a run started in the same second: the next free name
        number += 1
        path = Path("archives") / benchmark / f"{stamp}-{number}"
    return str(path)


# ./evolve_configs is on Hydra's search path for users' own configs; its absence is normal.
warnings.filterwarnings("ignore", message=r".*path=evolve_configs is not available")

if not OmegaConf.has_resolver("evolve_run_dir"):
    OmegaConf.register_new_resolver("evolve_run_dir", new_run_dir, use_cache=True)


# --- targets --------------------------------------------------------------------------------------


def _import_target(path: str) -> Any:
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ConfigError(
            f"_target_ {path!r} must be a dotted path such as mypackage.module.MyFitness"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"_target_ {path!r}: cannot import {module_name!r} ({exc}); is it installed or on PYTHONPATH?"
        ) from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise ConfigError(f"_target_ {path!r}: {module_name} has no attribute {attr!r}") from exc


def check_targets(node: Any, *, allowed: Sequence[str], key: str = "") -> None:
    """Refuse any ``_target_`` in ``node`` that is neither allowed by prefix nor a real fitness class."""
    if isinstance(node, Mapping):
        target = node.get("_target_")
        if target is not None:
            root = str(target).split(".", 1)[0]
            if root in DENIED_MODULES:
                raise ConfigError(
                    f"_target_ {target!r} at {key or '<root>'} is not allowed (standard-library callables cannot be targets)"
                )
            if not any(str(target).startswith(prefix) for prefix in (*ALWAYS_ALLOWED, *allowed)):
                obj = _import_target(str(target))
                is_fitness = inspect.isclass(obj) and callable(getattr(obj, "evaluate", None))
                if not (key.endswith("fitness") and is_fitness):
                    raise ConfigError(
                        f"_target_ {target!r} at {key or '<root>'} is not allowed; a fitness target must be a class "
                        "with an evaluate() method, other targets must start with an allowed prefix: add it to "
                        "config.allow_targets=[...]"
                    )
        for child_key, value in node.items():
            check_targets(
                value, allowed=allowed, key=f"{key}.{child_key}" if key else str(child_key)
            )
    elif isinstance(node, list | tuple):
        for index, value in enumerate(node):
            check_targets(value, allowed=allowed, key=f"{key}[{index}]")


# --- building -------------------------------------------------------------------------------------


def _dataclass_from(cls: type, values: Mapping[str, Any], group: str) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(
            f"unknown key(s) {unknown} in {group}; valid keys: {', '.join(sorted(names))}"
        )
    return cls(**values)


def build_benchmark(cfg: Mapping[str, Any], *, allowed: Sequence[str] = ()) -> Benchmark:
    """A Benchmark from the ``benchmark`` config node (paths resolved, fitness instantiated)."""
    check_targets(cfg, allowed=allowed, key="benchmark")
    missing = [k for k in ("name", "fitness", "seed") if not cfg.get(k)]
    if missing:
        raise ConfigError(
            f"benchmark config lacks {missing}; see configs/benchmark/circle_packing.yaml for the shape"
        )
    fitness = instantiate(OmegaConf.create(dict(cfg["fitness"])), _convert_="all")
    if not isinstance(fitness, Fitness):
        raise ConfigError(
            f"benchmark.fitness {cfg['fitness'].get('_target_')!r} does not implement the Fitness protocol "
            "(attributes objective, descriptors and a method evaluate(workdir, ctx))"
        )
    task_path = cfg.get("task")
    task = resolve_path(task_path).read_text() if task_path else ""
    # A fitness that picks its scale from the hardware (nanochat) may override seed, gpus, timeout_s.
    chosen = dict(getattr(fitness, "benchmark_overrides", None) or {})
    seed_dir, gpus, timeout_s = chosen.get("seed"), chosen.get("gpus"), chosen.get("timeout_s")
    return Benchmark(
        name=str(cfg["name"]),
        fitness=fitness,
        seed_dir=Path(seed_dir) if seed_dir is not None else resolve_path(cfg["seed"]),
        editable=tuple(cfg.get("editable") or ("*.py",)),
        task=task,
        harness_files=tuple(resolve_path(p) for p in cfg.get("harness") or ()),
        timeout_s=float(timeout_s if timeout_s is not None else cfg.get("timeout_s", 60.0)),
        gpus=int(gpus if gpus is not None else cfg.get("gpus", 0)),
    )


def search_settings(cfg: Mapping[str, Any]) -> SearchSettings:
    """SearchSettings from the ``search`` node plus the run seed; unknown keys are errors."""
    values = {k: v for k, v in cfg["search"].items() if k != "workers"}
    values["seed"] = int(cfg.get("seed", 0))
    try:
        return _dataclass_from(SearchSettings, values, "search")
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def workers(cfg: Mapping[str, Any]) -> int | None:
    """``search.workers``: an int, or None for 'auto' (one per GPU group or CPU core)."""
    value = cfg["search"].get("workers", "auto")
    if value in (None, "auto"):
        return None
    if not isinstance(value, int) or value < 1:
        raise ConfigError(f"search.workers must be 'auto' or a positive integer, got {value!r}")
    return value


def _changes_stored(stored: Any, override: str) -> bool:
    """Whether ``key=value`` asks for something other than what the stored config holds."""
    key, _, value = override.lstrip("+~").partition("=")
    wanted = yaml.safe_load(value) if value else None
    current = OmegaConf.select(stored, key, default=None)
    if isinstance(current, Mapping | DictConfig) and "name" in current:  # a group choice such as benchmark=toy
        return current["name"] != wanted
    return current != wanted


def merge_resumed(stored: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """The stored config of a run being resumed, with the command line's allowed overrides applied.

    Budgets (search.*, backend.*, llm.max_cost_usd) may change; anything else may only be
    repeated with its stored value.
    """
    merged = OmegaConf.create(dict(stored))
    OmegaConf.set_struct(merged, False)
    refused = [
        o for o in overrides if not o.lstrip("+~").startswith(RESUME_OVERRIDABLE) and _changes_stored(merged, o)
    ]
    if refused:
        raise ConfigError(
            f"cannot change {refused} when resuming: a resumed run keeps its benchmark, archive and operators. "
            f"Only budgets may change ({', '.join(RESUME_OVERRIDABLE)}); start a new run for other changes"
        )
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if key.startswith(("hydra.", "resume")) or not key.startswith(RESUME_OVERRIDABLE):
            continue
        OmegaConf.update(merged, key, yaml.safe_load(value) if value else None, force_add=True)
    return OmegaConf.to_container(merged, resolve=True)  # type: ignore[return-value]


def with_benchmark_search_defaults(cfg: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply the benchmark's own ``search:`` defaults, except keys set on the command line."""
    defaults = (cfg.get("benchmark") or {}).get("search") or {}
    given = {o.lstrip("+~").partition("=")[0] for o in overrides}
    search = dict(cfg["search"])
    search.update({k: v for k, v in defaults.items() if f"search.{k}" not in given})
    return {**cfg, "search": search}


def as_dict(cfg: Any) -> dict[str, Any]:
    """A resolved plain-dict copy of a DictConfig."""
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
