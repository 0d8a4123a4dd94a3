"""Checks made before a run spends anything: the model strings, API keys, servers, commands."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx

from evolve.llm._litellm import litellm
from evolve.llm.errors import PreflightError
from evolve.llm.settings import LLMSettings

EXAMPLES = (
    "openai/gpt-4o-mini, anthropic/claude-sonnet-4-5, gemini/gemini-2.5-flash, "
    "ollama/llama3.1 or command/<name>"
)
LOCAL_DEFAULTS = {"ollama": "OLLAMA_API_BASE", "ollama_chat": "OLLAMA_API_BASE"}


async def preflight(settings: LLMSettings, *, probe_timeout_s: float = 5.0) -> list[str]:
    """Check every configured model; returns warnings, raises on what would make every call fail.

    Checked: litellm knows the provider of each model string; the provider's API key
    variable is set (named in the error); a configured ``api_base`` (or a local
    provider's default server) answers HTTP; ``command/<name>`` names a configured
    command whose executable exists. With ``llm.offline`` only the model strings are
    checked (no call will be made).

    Raises:
        PreflightError: with the fix in its message.
    """
    lit = litellm()
    warnings: list[str] = []
    for model, _weight in settings.models:
        if model.startswith("command/"):
            _check_command(model, settings, runnable=not settings.offline)
            continue
        try:
            _name, provider, _key, default_base = lit.get_llm_provider(
                model, api_base=settings.api_base
            )
        except Exception as exc:
            raise PreflightError(
                f"llm.model {model!r}: litellm does not know which provider serves it ({type(exc).__name__}); "
                f"write it as <provider>/<model>, e.g. {EXAMPLES} (see https://docs.litellm.ai/docs/providers)"
            ) from None
        if settings.pricing is None and settings.max_cost_usd is not None and not _priced(model):
            warnings.append(
                f"litellm has no price for {model}; llm.max_cost_usd cannot limit its calls "
                "(set llm.pricing.input_per_mtok / output_per_mtok to count them)"
            )
        if settings.offline:
            continue
        base = settings.api_base
        if base is None and provider in LOCAL_DEFAULTS:
            base = os.environ.get(LOCAL_DEFAULTS[provider]) or default_base
        if base:
            if settings.api_key_env and not os.environ.get(settings.api_key_env):
                raise PreflightError(
                    f"llm.api_key_env names {settings.api_key_env}, which is not set; export {settings.api_key_env}=... "
                    "or drop llm.api_key_env if the server needs no key"
                )
            await _check_server(model, base, probe_timeout_s)
            continue
        env = lit.validate_environment(model)
        if not env.get("keys_in_environment", False):
            missing = env.get("missing_keys") or []
            if missing:
                raise PreflightError(
                    f"llm.model {model!r} needs the environment variable {' or '.join(missing)}; "
                    f"export {missing[0]}=<your key> and run again (or choose another llm.model)"
                )
        if not _priced(model):
            warnings.append(
                f"litellm does not list {model}; check the spelling if its first call fails"
            )
    return warnings


def _priced(model: str) -> bool:
    lit = litellm()
    try:
        cost_in, cost_out = lit.cost_per_token(
            model=model, prompt_tokens=1000, completion_tokens=1000
        )
    except Exception:
        return False
    return cost_in + cost_out > 0


def _check_command(model: str, settings: LLMSettings, *, runnable: bool) -> None:
    """The model names a configured command; with ``runnable``, its program exists too."""
    name = model.split("/", 1)[1]
    argv = settings.commands.get(name)
    if argv is None:
        known = ", ".join(sorted(settings.commands)) or "none configured"
        raise PreflightError(
            f"llm.model {model!r}: no command named {name!r} ({known}); "
            f"set llm.commands.{name}='<command line reading the prompt on stdin>'"
        )
    program = argv[0]
    if runnable and not (
        shutil.which(program) or (Path(program).is_file() and os.access(program, os.X_OK))
    ):
        raise PreflightError(
            f"llm.commands.{name}: {program!r} is not an executable on PATH or a path to one; fix the command line"
        )


async def _check_server(model: str, base: str, timeout_s: float) -> None:
    """Any HTTP answer from the server's model list means it is up; no answer is an error."""
    url = base.rstrip("/") + "/models"
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            await client.get(url)
    except httpx.HTTPError as exc:
        raise PreflightError(
            f"llm.model {model!r}: the server at {base} does not answer ({type(exc).__name__}: {exc}); "
            "start it (e.g. `vllm serve <model>` or `ollama serve`) or fix llm.api_base"
        ) from None
