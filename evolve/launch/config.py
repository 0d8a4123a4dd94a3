"""The only module that knows Hydra: config schemas, path resolution, and safe instantiation.

Configs are YAML groups under ``evolve/configs`` (the repository's ``configs/``). Every
``_target_`` is checked before it is imported: it must lie under an allowed module prefix
(``evolve.`` and ``config.allow_targets``) or resolve to a class that implements the
protocol its key requires (a ``fitness`` must have ``evaluate``). So a config file, or a
resumed archive's stored config, cannot instantiate arbitrary callables such as
``os.system``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import importlib
import importlib.resources
import inspect
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from hydra.errors import CompactHydraException, InstantiationException, OverrideParseException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from evolve.harness.fitness import Benchmark, Fitness
from evolve.llm.settings import LLMSettings
from evolve.paths import resolve_path
from evolve.settings import (
    Alternative,
    ArchiveSettings,
    AuditSettings,
    BuiltinWeights,
    ConfigError,
    EmitterSettings,
    NoiseSettings,
    RunSettings,
    SearchSettings,
)
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
    "search.",
    "backend.",
    "llm.max_cost_usd",
    "resume",
    "hydra.",
    "progress",
    "dry_run",
    "llm.offline",
    "llm.replay_from",
    "llm.timeout_s",
    "llm.retries",
    "llm.api_base",
)


class FitnessBuildError(ConfigError):
    """The benchmark's fitness refused to be built here (missing data, hardware, a bad parameter)."""


# --- paths ----------------------------------------------------------------------------------------


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


def _dataclass_from(cls: type, values: Mapping[str, Any] | None, group: str) -> Any:
    """``cls(**values)``; unknown keys and impossible values become a ConfigError naming the valid ones."""
    values = dict(values or {})
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(
            f"unknown key(s) {unknown} in {group}; valid keys: {', '.join(sorted(names))}"
        )
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


def build_benchmark(cfg: Mapping[str, Any], *, allowed: Sequence[str] = ()) -> Benchmark:
    """A Benchmark from the ``benchmark`` config node (paths resolved, fitness instantiated)."""
    check_targets(cfg, allowed=allowed, key="benchmark")
    missing = [k for k in ("name", "fitness", "seed") if not cfg.get(k)]
    if missing:
        raise ConfigError(
            f"benchmark config lacks {missing}; see configs/benchmark/circle_packing.yaml for the shape"
        )
    try:
        fitness = instantiate(OmegaConf.create(dict(cfg["fitness"])), _convert_="all")
    except InstantiationException as exc:
        cause = exc.__cause__
        reason = str(cause) if isinstance(cause, EvolveError) else f"{cause or exc!r}"
        raise FitnessBuildError(
            f"benchmark {cfg['name']}: its fitness {cfg['fitness'].get('_target_')!r} cannot be built "
            f"here: {reason}"
        ) from None
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
    timeout_s = _checked_number(
        timeout_s if timeout_s is not None else cfg.get("timeout_s", 60.0), "benchmark.timeout_s"
    )
    if timeout_s <= 0:
        raise ConfigError(f"benchmark.timeout_s must be > 0 seconds, got {timeout_s:g}")
    return Benchmark(
        name=str(cfg["name"]),
        fitness=fitness,
        seed_dir=Path(seed_dir) if seed_dir is not None else resolve_path(cfg["seed"]),
        editable=tuple(cfg.get("editable") or ("*.py",)),
        task=task,
        harness_files=tuple(resolve_path(p) for p in cfg.get("harness") or ()),
        timeout_s=timeout_s,
        gpus=int(gpus if gpus is not None else cfg.get("gpus", 0)),
        prescribed=tuple(str(name) for name in cfg.get("prescribed") or ()),
        shown_metrics=tuple(str(name) for name in cfg.get("shown_metrics") or ()),
    )


def search_settings(cfg: Mapping[str, Any]) -> SearchSettings:
    """SearchSettings from the ``search`` node plus the run seed; unknown keys are errors."""
    values = {k: v for k, v in cfg["search"].items() if k != "workers"}
    seed = cfg.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an integer, got {seed!r}; e.g. seed=0")
    values["seed"] = seed
    return _dataclass_from(SearchSettings, values, "search")


def _checked_number(value: Any, name: str) -> float:
    """``value`` as a float, or a ConfigError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    return float(value)


def audit_settings(cfg: Mapping[str, Any]) -> AuditSettings:
    """The ``audit`` group (the auditor stage); absent in runs made before it existed: enabled."""
    return _dataclass_from(AuditSettings, cfg.get("audit"), "audit")


def workers(cfg: Mapping[str, Any]) -> int | None:
    """``search.workers``: an int, or None for 'auto' (one per GPU group or CPU core)."""
    value = cfg["search"].get("workers", "auto")
    if value in (None, "auto"):
        return None
    if not isinstance(value, int) or value < 1:
        raise ConfigError(f"search.workers must be 'auto' or a positive integer, got {value!r}")
    return value


BACKENDS = ("local", "ray")


def alternatives(node: Any) -> tuple[Alternative, ...]:
    """The ``benchmark.alternatives`` list: entries ``{gpus, args, why}``, best first."""
    made = []
    for index, entry in enumerate(node or ()):
        where = f"benchmark.alternatives[{index}]"
        if not isinstance(entry, Mapping) or set(entry) != {"gpus", "args", "why"}:
            raise ConfigError(
                f"{where} must have exactly the keys args, gpus and why; got {entry!r}"
            )
        gpus = entry["gpus"]
        if not isinstance(gpus, int) or gpus < 0:
            raise ConfigError(f"{where}.gpus must be an integer >= 0, got {gpus!r}")
        args = entry["args"]
        args = tuple(args.split() if isinstance(args, str) else args)
        made.append(Alternative(gpus=gpus, args=args, why=str(entry["why"])))
    return tuple(made)


def build_settings(cfg: Mapping[str, Any]) -> RunSettings:
    """The typed settings of the run ``cfg`` describes; checks every group before the benchmark is built.

    Raises:
        ConfigError: an unknown key, an impossible value or a target that is not allowed;
            the message names the key and what it accepts.
        evolve.llm.LLMConfigError: the same for the ``llm`` group.
    """
    backend = (cfg.get("backend") or {}).get("name", "local")
    if backend not in BACKENDS:
        raise ConfigError(f"backend {backend!r} unknown; available: {', '.join(BACKENDS)}")
    try:
        node = dict(cfg.get("noise") or {})
        if node.get("seeds") is None:  # a benchmark whose score varies says how often to measure it
            node["seeds"] = int(cfg["benchmark"].get("noise_seeds") or 1)
        noise = NoiseSettings.from_config(node)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    checked = dict(
        config=dict(cfg),
        search=search_settings(cfg),
        workers=workers(cfg),
        archive=_dataclass_from(ArchiveSettings, cfg.get("archive"), "archive"),
        emitter=_dataclass_from(EmitterSettings, cfg.get("emitter"), "emitter"),
        noise=noise,
        builtin=_dataclass_from(
            BuiltinWeights, (cfg.get("operators") or {}).get("builtin"), "operators.builtin"
        ),
        llm=LLMSettings.from_config(cfg.get("llm")),
        backend=backend,
        alternatives=alternatives(cfg["benchmark"].get("alternatives")),
        dry_run=bool(cfg.get("dry_run", False)),
        audit=audit_settings(cfg),
    )
    benchmark = build_benchmark(cfg["benchmark"], allowed=tuple(cfg.get("allow_targets") or ()))
    return RunSettings(benchmark=benchmark, **checked)


def _changes_stored(stored: Any, override: str, given: Sequence[str] = ()) -> bool:
    """Whether ``key=value`` asks for something other than what the stored config holds
    (``given``: the keys the same command line sets, which a group choice does not decide)."""
    key, _, value = override.lstrip("+~").partition("=")
    wanted = yaml.safe_load(value) if value else None
    current = OmegaConf.select(stored, key, default=None)
    if (
        isinstance(current, Mapping | DictConfig) and "name" in current
    ):  # a group choice such as benchmark=toy
        return current["name"] != wanted
    if isinstance(current, Mapping | DictConfig) and isinstance(wanted, str) and "." not in key:
        # a group without a name (llm=local): the same choice if what it sets is what is stored
        chosen = compose([f"{key}={wanted}"]).get(key) or {}
        return any(
            current.get(name) != chosen[name]
            for name in chosen
            if not any(g == f"{key}.{name}" or g.startswith(f"{key}.{name}.") for g in given)
        )
    return current != wanted


def merge_resumed(stored: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """The stored config of a run being resumed, with the command line's allowed overrides applied.

    Budgets (search.*, backend.*, llm.max_cost_usd) may change; anything else may only be
    repeated with its stored value.
    """
    merged = OmegaConf.create(dict(stored))
    OmegaConf.set_struct(merged, False)
    given = [o.lstrip("+~").partition("=")[0] for o in overrides]
    refused = [
        o
        for o in overrides
        if not o.lstrip("+~").startswith(RESUME_OVERRIDABLE) and _changes_stored(merged, o, given)
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


def compose(overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The resolved config of ``python -m evolve OVERRIDES``, composed without starting a Hydra app."""
    from hydra import compose as compose_config
    from hydra import initialize_config_module

    with (
        hydra_errors(),
        initialize_config_module(config_module="evolve.configs", version_base=None),
    ):
        return as_dict(compose_config(config_name="config", overrides=list(overrides)))


@contextlib.contextmanager
def hydra_errors() -> Iterator[None]:
    """Raise Hydra's own errors (a typo'd key, an unknown option, a bad override) as a ConfigError.

    Hydra prints them itself and exits 1 unless ``HYDRA_FULL_ERROR=1``, which makes it raise
    them instead; set for the block, so they are raised as a ConfigError like every start error.
    """
    previous = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        yield
    except (CompactHydraException, OmegaConfBaseException) as exc:
        raise ConfigError(hydra_message(exc)) from None
    finally:
        if previous is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = previous


def hydra_message(exc: Exception) -> str:
    """The message of a Hydra or OmegaConf error; a key not in the config names the valid ones."""
    cause = exc.__cause__ if isinstance(exc.__cause__, OmegaConfBaseException) else exc
    parent = getattr(cause, "parent_node", None)
    full_key = str(getattr(cause, "full_key", "") or "")
    if isinstance(parent, DictConfig) and "not in struct" in str(cause) and full_key:
        group, _, key = full_key.rpartition(".")
        where = f"in {group}" if group else "at the top level"
        return (
            f"unknown key(s) [{key!r}] {where}; valid keys: {', '.join(sorted(map(str, parent)))}"
        )
    if isinstance(exc, OverrideParseException):
        return f"cannot parse the override {exc.override!r}: {str(exc).strip()}"
    return str(exc).strip()


def as_dict(cfg: Any) -> dict[str, Any]:
    """A resolved plain-dict copy of a DictConfig; an interpolation that fails is a ConfigError."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except OmegaConfBaseException as exc:
        raise ConfigError(hydra_message(exc)) from None
