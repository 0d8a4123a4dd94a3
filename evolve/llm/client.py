"""One call to a model through litellm: recorded answers first, then budget, retries, cost, recording."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from evolve.llm._litellm import litellm
from evolve.llm.command import register_command_provider
from evolve.llm.errors import BudgetExceeded, LLMCallFailed, LLMStop, ReplayMiss
from evolve.llm.ledger import CallRecord, Ledger, Messages, cache_key
from evolve.llm.retry import MAX_RETRY_AFTER_S, classify, describe, fix_for, retry_after
from evolve.llm.settings import LLMSettings
from evolve.store import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Completion:
    """A model's answer and what it cost (``cached``: served from the archive, free)."""

    text: str
    model: str
    tokens_in: int
    tokens_out: int
    cost: float | None
    latency_s: float
    cached: bool
    call_id: int


class LLMClient:
    """Calls models through ``litellm.acompletion``, recording every attempt in ``llm_calls``.

    A request whose (model, messages, sampling parameters, sample index) was answered
    before in this archive, or in ``llm.replay_from``, gets that answer again without a
    call. Otherwise the budget is checked, the call is made with a per-call timeout and
    retried with exponential backoff (honouring Retry-After) on rate limits, timeouts,
    connection errors and 5xx.

    Args:
        settings: the ``llm`` config group.
        store: the run's archive (``llm_calls`` lives there).
    """

    def __init__(self, settings: LLMSettings, *, store: Store) -> None:
        self.settings = settings
        self.ledger = Ledger(store, replay_from=settings.replay_from)
        self._spent = self.ledger.spent()
        self._reserved = 0.0
        self._jitter = random.Random()
        self.attempts = 0  # provider calls made by this client (cache hits excluded)
        self.cache_hits = 0
        self.waits: list[float] = []  # backoff sleeps, in order (for logs and tests)
        if settings.commands:
            register_command_provider(settings.commands)

    def spent(self) -> float:
        """USD spent on calls recorded in this archive (previous sessions of the run included)."""
        return self._spent

    # --- budget ------------------------------------------------------------------------------------

    def worst_case_cost(self, model: str, messages: Messages) -> float:
        """The most one call could cost: its prompt plus the answer cap as sent (0 if unpriced)."""
        lit = litellm()
        try:
            tokens_in = int(lit.token_counter(model=model, messages=list(messages)))
        except Exception:
            tokens_in = sum(len(str(m.get("content", ""))) for m in messages) // 3
        tokens_out = self.settings.answer_cap()
        if self.settings.pricing is not None:
            return self.settings.pricing.cost(tokens_in, tokens_out)
        try:
            cost_in, cost_out = lit.cost_per_token(
                model=model, prompt_tokens=tokens_in, completion_tokens=tokens_out
            )
        except Exception:
            return 0.0
        return float(cost_in + cost_out)

    def _check_budget(self, worst: float) -> None:
        limit = self.settings.max_cost_usd
        if limit is None:
            return
        committed = self._spent + self._reserved
        if committed >= limit or committed + worst > limit:
            could = f"; the next call could cost up to ${worst:.4f}" if worst else ""
            raise BudgetExceeded(
                f"LLM budget reached: ${self._spent:.4f} spent of llm.max_cost_usd=${limit:g}{could}; "
                "raise llm.max_cost_usd and resume the run to continue"
            )

    def _cost(self, model: str, response: Any, tokens_in: int, tokens_out: int) -> float | None:
        if self.settings.pricing is not None:
            return self.settings.pricing.cost(tokens_in, tokens_out)
        hidden = getattr(response, "_hidden_params", None) or {}
        if hidden.get("response_cost") is not None:
            return float(hidden["response_cost"])
        try:
            return float(litellm().completion_cost(completion_response=response, model=model))
        except Exception:
            return None  # litellm has no price for this model: tokens only

    # --- the call ----------------------------------------------------------------------------------

    def _call_kwargs(self, model: str, messages: Messages, sample: str | int) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": [dict(m) for m in messages],
            "timeout": self.settings.timeout_s,
            "num_retries": 0,
            **self.settings.sampling(),
        }
        if model.startswith(
            "command/"
        ):  # the command sees EVOLVE_SAMPLE (litellm keeps metadata local)
            kwargs["metadata"] = {"evolve_sample": str(sample)}
        if self.settings.api_base and not model.startswith("command/"):
            kwargs["api_base"] = self.settings.api_base
        if self.settings.api_key_env:
            import os

            kwargs["api_key"] = os.environ.get(self.settings.api_key_env, "")
        elif self.settings.api_base:
            kwargs.setdefault("api_key", "none")  # local servers usually take any key
        return kwargs

    async def complete(
        self,
        model: str,
        messages: Messages,
        *,
        sample: str | int,
        prompt_hash: str,
        candidate: str | None = None,
    ) -> Completion:
        """The answer to ``messages`` from ``model``.

        Args:
            model: a litellm model string.
            messages: chat messages.
            sample: which sample of this prompt (part of the cache key; a resumed run asks
                for the same samples and gets the recorded answers).
            prompt_hash: stored with the call (links it to the candidate's prompt).
            candidate: the candidate the call is for, if known.

        Raises:
            BudgetExceeded: no call may start without risking the budget.
            ReplayMiss: ``llm.offline`` and no recorded answer.
            LLMStop: the provider refused the key, the model, or the account.
            LLMCallFailed: the call failed, after retries where the error allows them.
        """
        key = cache_key(model, messages, self.settings.sampling(), sample)
        recorded = self.ledger.lookup(key, same_request=self.settings.offline)
        if recorded is not None:
            self.cache_hits += 1
            if recorded.source != "archive":  # copy a replayed answer into this archive, at no cost
                call_id = self.ledger.record(
                    CallRecord(
                        model=model,
                        prompt_hash=prompt_hash,
                        cache_key=key,
                        messages=messages,
                        response=recorded.response,
                        tokens_in=recorded.tokens_in,
                        tokens_out=recorded.tokens_out,
                        cost=0.0,
                        candidate=candidate,
                    )
                )
            else:
                call_id = recorded.call_id
            return Completion(
                text=recorded.response,
                model=model,
                tokens_in=recorded.tokens_in,
                tokens_out=recorded.tokens_out,
                cost=0.0,
                latency_s=0.0,
                cached=True,
                call_id=call_id,
            )
        if self.settings.offline:
            raise ReplayMiss(
                f"llm.offline=true and the archive holds no answer of {model} for this prompt "
                f"(prompt {prompt_hash[:12]}, sample {sample}); the replay ends here. "
                "Set llm.offline=false to call the model from this point on"
            )
        worst = self.worst_case_cost(model, messages)
        self._check_budget(worst)
        self._reserved += worst
        try:
            return await self._attempts(
                model,
                messages,
                key=key,
                prompt_hash=prompt_hash,
                candidate=candidate,
                sample=sample,
            )
        finally:
            self._reserved -= worst

    async def _attempts(
        self,
        model: str,
        messages: Messages,
        *,
        key: str,
        prompt_hash: str,
        candidate: str | None,
        sample: str | int,
    ) -> Completion:
        lit = litellm()
        tries = self.settings.retries + 1
        for attempt in range(tries):
            start = time.monotonic()
            self.attempts += 1
            try:
                response = await asyncio.wait_for(
                    lit.acompletion(**self._call_kwargs(model, messages, sample)),
                    self.settings.timeout_s + min(5.0, 0.1 * self.settings.timeout_s),
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                latency = time.monotonic() - start
                error = describe(exc)
                self.ledger.record(
                    CallRecord(
                        model=model,
                        prompt_hash=prompt_hash,
                        cache_key=key,
                        messages=messages,
                        error=error,
                        latency_s=latency,
                        candidate=candidate,
                    )
                )
                kind = classify(exc)
                if kind == "fatal":
                    raise LLMStop(f"{model}: {error}\n{fix_for(model, exc)}") from exc
                if kind == "retry" and attempt + 1 < tries:
                    delay = self._delay(attempt, exc)
                    log.warning(
                        "%s: %s; retrying in %.1fs (attempt %d of %d)",
                        model,
                        error[:200],
                        delay,
                        attempt + 2,
                        tries,
                    )
                    self.waits.append(delay)
                    await asyncio.sleep(delay)
                    continue
                raise LLMCallFailed(f"{model}: {error} (attempt {attempt + 1} of {tries})") from exc
            return self._success(
                model,
                messages,
                response,
                key=key,
                prompt_hash=prompt_hash,
                candidate=candidate,
                latency=time.monotonic() - start,
            )
        raise AssertionError("unreachable")

    def _delay(self, attempt: int, exc: BaseException) -> float:
        backoff = min(self.settings.backoff_max_s, self.settings.backoff_s * 2**attempt)
        backoff *= 1 + 0.25 * self._jitter.random()
        asked = retry_after(exc)
        return min(MAX_RETRY_AFTER_S, max(backoff, asked)) if asked is not None else backoff

    def _success(
        self,
        model: str,
        messages: Messages,
        response: Any,
        *,
        key: str,
        prompt_hash: str,
        candidate: str | None,
        latency: float,
    ) -> Completion:
        choices = getattr(response, "choices", None) or []
        message = getattr(choices[0], "message", None) if choices else None
        text = (getattr(message, "content", None) or "") if message is not None else ""
        usage = getattr(response, "usage", None)
        tokens_in = int(getattr(usage, "prompt_tokens", 0) or 0)
        tokens_out = int(getattr(usage, "completion_tokens", 0) or 0)
        cost = self._cost(model, response, tokens_in, tokens_out)
        call_id = self.ledger.record(
            CallRecord(
                model=model,
                prompt_hash=prompt_hash,
                cache_key=key,
                messages=messages,
                response=text,
                tokens_in=tokens_in,
                tokens_out=tokens_out,
                cost=cost,
                latency_s=latency,
                candidate=candidate,
            )
        )
        self._spent += cost or 0.0
        return Completion(
            text=text,
            model=model,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            cost=cost,
            latency_s=latency,
            cached=False,
            call_id=call_id,
        )


def usage_line(summary: Mapping[str, Mapping[str, Any]]) -> str:
    """One line per model: calls, errors, tokens and USD (for the end-of-run log)."""
    lines = []
    for model, row in summary.items():
        cost = f"${row['cost']:.4f}" if row["cost"] else "no price"
        lines.append(
            f"{model}: {row['calls']} calls ({row['errors']} failed), {row['tokens_in']} tokens in, "
            f"{row['tokens_out']} out, {cost}"
        )
    return "\n".join(lines)
