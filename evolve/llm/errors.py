"""Exceptions of the LLM layer: the ones that end a run cleanly, and a call that failed."""

from __future__ import annotations

from evolve.types import EvolveError


class LLMStop(EvolveError):
    """No further LLM call may be made in this run; the search stops proposing and finishes.

    Evaluations already in flight complete; the message says why the run ended and how
    to continue it.
    """


class BudgetExceeded(LLMStop):
    """The next call could take the run past ``llm.max_cost_usd``."""


class ReplayMiss(LLMStop):
    """An offline replay met a prompt that the archive has no recorded answer for."""


class PreflightError(EvolveError):
    """A model cannot be used as configured (unknown, no API key, server unreachable)."""


class LLMCallFailed(Exception):
    """One call failed for good (after the retries its error allows); every attempt is recorded."""
