"""The LLM layer over litellm: settings, the client (cache, budget, retries, cost), preflight, ``command``."""

from evolve.llm.client import Completion, LLMClient, usage_line
from evolve.llm.command import prompt_text, register_command_provider
from evolve.llm.errors import BudgetExceeded, LLMCallFailed, LLMStop, PreflightError, ReplayMiss
from evolve.llm.ledger import Ledger, cache_key
from evolve.llm.preflight import preflight
from evolve.llm.settings import LLMConfigError, LLMSettings, Pricing

__all__ = [
    "BudgetExceeded",
    "Completion",
    "LLMCallFailed",
    "LLMClient",
    "LLMConfigError",
    "LLMSettings",
    "LLMStop",
    "Ledger",
    "PreflightError",
    "Pricing",
    "ReplayMiss",
    "cache_key",
    "preflight",
    "prompt_text",
    "register_command_provider",
    "usage_line",
]
