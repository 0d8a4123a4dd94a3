"""The ``llm`` config group as a typed object: models and weights, sampling, limits, budget, replay."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolve.types import EvolveError

OPERATOR_NAMES = ("diff", "rewrite", "crossover")


class LLMConfigError(EvolveError):
    """The ``llm`` config group is inconsistent; the message names the setting to fix."""


@dataclass(frozen=True, kw_only=True)
class Pricing:
    """USD per million tokens, for models litellm has no price for (local servers, commands)."""

    input_per_mtok: float = 0.0
    output_per_mtok: float = 0.0

    def cost(self, tokens_in: int, tokens_out: int) -> float:
        return (tokens_in * self.input_per_mtok + tokens_out * self.output_per_mtok) / 1e6


@dataclass(frozen=True, kw_only=True)
class LLMSettings:
    """How the run talks to language models.

    Attributes:
        models: (litellm model string, weight) pairs; ``llm.model`` is a one-entry list.
        temperature: sampling temperature.
        max_tokens: the longest answer asked for.
        api_base: base URL of an OpenAI-compatible server (vLLM, Ollama, llama.cpp server).
        api_key_env: environment variable holding the key to send (for servers that want one).
        timeout_s: limit for one call, retries excluded.
        retries: further attempts after a rate limit, timeout, connection error or 5xx.
        backoff_s: first wait between attempts (doubled each time, plus jitter, capped).
        backoff_max_s: the longest wait between attempts.
        max_concurrency: the most calls in flight at once to one provider (one server).
        max_cost_usd: hard budget; no call starts that could take the run past it.
        offline: serve every call from recorded answers; a prompt with none ends the run.
        replay_from: another archive.db whose recorded answers are served as well.
        commands: for ``command/<name>`` models: name -> command line (prompt on stdin);
            ``llm.command`` gives the one for every ``command/<name>`` not listed.
        pricing: price for models litellm cannot price (overrides litellm when set).
        operators: weight of each LLM operator (diff, rewrite, crossover) per model.
        artifact_chars: how much of a parent's artifacts a prompt shows.
        context_tokens: the model's context window, prompt and answer together, for models
            litellm does not know (commands, local servers) or to use less of it; None: as
            litellm knows it (``evolve.operators.prompting.prompt_limit``).
        notebook_chars: the size of the research notebook each prompt shows (``evolve.research.notebook``).
        notebook_summary_every: every N proposals the first model summarises the notebook
            (``evolve.research.summary``); 0: never.
        params: further litellm parameters passed through (top_p, reasoning_effort...).
    """

    models: tuple[tuple[str, float], ...] = ()
    temperature: float = 0.8
    max_tokens: int = 4096
    api_base: str | None = None
    api_key_env: str | None = None
    timeout_s: float = 300.0
    retries: int = 4
    backoff_s: float = 2.0
    backoff_max_s: float = 60.0
    max_concurrency: int = 8
    max_cost_usd: float | None = None
    offline: bool = False
    replay_from: str | None = None
    commands: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    pricing: Pricing | None = None
    operators: Mapping[str, float] = field(
        default_factory=lambda: {"diff": 1.0, "rewrite": 0.3, "crossover": 0.5}
    )
    artifact_chars: int = 3000
    context_tokens: int | None = None
    notebook_chars: int = 6000
    notebook_summary_every: int = 25
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return bool(self.models)

    def sampling(self) -> dict[str, Any]:
        """The parameters that shape an answer (part of the response cache key)."""
        return {"temperature": self.temperature, "max_tokens": self.max_tokens, **dict(self.params)}

    def answer_cap(self) -> int:
        """The most answer tokens a call may get, as sent (``llm.params`` may raise ``max_tokens``)."""
        sent = self.sampling()
        caps = [sent.get(key) for key in ("max_tokens", "max_completion_tokens")]
        return max(int(cap) for cap in caps if cap is not None)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None) -> LLMSettings:
        """Build from the ``llm`` group (a plain mapping); unknown keys are an error."""
        cfg = dict(cfg or {})
        known = {f for f in cls.__dataclass_fields__} | {"model", "name", "command"}
        unknown = sorted(set(cfg) - known)
        if unknown:
            raise LLMConfigError(
                f"unknown llm settings {unknown}; known: {', '.join(sorted(known))}"
            )
        models = _models(cfg.pop("model", None), cfg.pop("models", None))
        cfg.pop("name", None)
        commands = {str(k): _argv(k, v) for k, v in dict(cfg.pop("commands", None) or {}).items()}
        command = cfg.pop("command", None)
        models = _label_commands(models, command)
        if command:  # the command line of every command/<name> model not named in llm.commands
            for name, _ in models:
                if name.startswith("command/"):
                    commands.setdefault(name.split("/", 1)[1], _argv("command", command))
        pricing = cfg.pop("pricing", None)
        operators = dict(
            cfg.pop("operators", None) or {"diff": 1.0, "rewrite": 0.3, "crossover": 0.5}
        )
        bad = sorted(set(operators) - set(OPERATOR_NAMES))
        if bad:
            raise LLMConfigError(
                f"llm.operators names unknown operators {bad}; choose from {', '.join(OPERATOR_NAMES)}"
            )
        if any(float(w) < 0 for w in operators.values()):
            raise LLMConfigError("llm.operators weights must be >= 0 (0 turns an operator off)")
        settings = cls(
            models=models,
            commands=commands,
            pricing=Pricing(**dict(pricing)) if pricing else None,
            operators={k: float(v) for k, v in operators.items()},
            params=dict(cfg.pop("params", None) or {}),
            **{k: v for k, v in cfg.items() if v is not None or k in ("api_base", "max_cost_usd")},
        )
        if settings.max_cost_usd is not None and settings.max_cost_usd < 0:
            raise LLMConfigError(f"llm.max_cost_usd must be >= 0, got {settings.max_cost_usd}")
        if settings.timeout_s <= 0:
            raise LLMConfigError(f"llm.timeout_s must be > 0, got {settings.timeout_s}")
        if settings.max_concurrency < 1:
            raise LLMConfigError(
                f"llm.max_concurrency must be >= 1 (calls in flight per provider), got {settings.max_concurrency}"
            )
        caps = {k: settings.sampling().get(k) for k in ("max_tokens", "max_completion_tokens")}
        for key, cap in caps.items():
            if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
                raise LLMConfigError(
                    f"llm.{key} must be a whole number of tokens >= 1, got {cap!r}"
                )
        if settings.retries < 0:
            raise LLMConfigError(f"llm.retries must be >= 0, got {settings.retries}")
        return settings


def _models(model: Any, models: Any) -> tuple[tuple[str, float], ...]:
    """``llm.model`` and ``llm.models`` merged into (model, weight) pairs."""
    pairs: list[tuple[str, float]] = []
    if model:
        pairs.append((str(model), 1.0))
    if isinstance(models, Mapping):
        pairs += [(str(k), float(v)) for k, v in models.items()]
    elif isinstance(models, Sequence) and not isinstance(models, str):
        for entry in models:
            if isinstance(entry, str):
                pairs.append((entry, 1.0))
            elif isinstance(entry, Mapping) and "model" in entry:
                pairs.append((str(entry["model"]), float(entry.get("weight", 1.0))))
            else:
                raise LLMConfigError(
                    f"llm.models entry {entry!r} is not understood; write a model string or {{model: ..., weight: ...}}"
                )
    elif models:
        raise LLMConfigError(
            f"llm.models must be a list or a mapping of model -> weight, got {models!r}"
        )
    seen: set[str] = set()
    for name, weight in pairs:
        if weight <= 0:
            raise LLMConfigError(f"llm.models weight of {name!r} must be > 0, got {weight}")
        if name in seen:
            raise LLMConfigError(f"model {name!r} is listed twice in llm.model / llm.models")
        seen.add(name)
    return tuple(pairs)


_LAUNCHERS = {
    "python",
    "python3",
    "node",
    "bash",
    "sh",
    "uv",
    "uvx",
    "npx",
    "deno",
    "ruby",
    "perl",
    "env",
}


def _label_commands(
    models: tuple[tuple[str, float], ...], command: Any
) -> tuple[tuple[str, float], ...]:
    """A bare ``command`` model named after the program ``llm.command`` runs: ``command/<program>``."""
    if not any(name == "command" for name, _ in models):
        return models
    if not command:
        raise LLMConfigError(
            "llm.model=command needs llm.command='<command line reading the prompt on stdin>' "
            "(or name it: llm.model=command/<name> with llm.commands.<name>)"
        )
    label = command_label(_argv("command", command))
    return tuple((f"command/{label}" if name == "command" else name, w) for name, w in models)


def command_label(argv: Sequence[str]) -> str:
    """The program a command line runs, as a model name: ``llama-cli -m x`` -> ``llama-cli``;
    ``python agents/coder.py`` -> ``coder`` (an interpreter is skipped for its script)."""
    words = list(argv)
    while words:
        stem = Path(words[0]).stem if words[0].endswith(".py") else Path(words[0]).name
        program = re.sub(r"[\d.]+$", "", stem) if stem.startswith("python") else stem
        rest = [w for w in words[1:] if not w.startswith("-") and w != "run"]
        if program not in _LAUNCHERS or not rest:
            return re.sub(r"[^\w.-]", "_", stem) or "command"
        words = rest
    return "command"


def _argv(name: Any, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        argv = tuple(shlex.split(value))
    elif isinstance(value, Sequence):
        argv = tuple(str(v) for v in value)
    else:
        argv = ()
    if not argv:
        raise LLMConfigError(
            f"llm.commands.{name} must be a command line (string or list), got {value!r}"
        )
    return argv
