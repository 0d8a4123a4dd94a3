"""Calls to models through litellm (chat answers and embeddings): recorded answers first, then
budget, provider limits, retries, cost."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from evolve.llm._litellm import litellm, quiet
from evolve.llm.command import end_command_processes, register_command_provider
from evolve.llm.errors import LLMCallFailed, LLMStop, ReplayMiss
from evolve.llm.ledger import CallRecord, Ledger, Messages, Recorded, cache_key, text_hash
from evolve.llm.limits import Budget, Lanes
from evolve.llm.retry import MAX_RETRY_AFTER_S, classify, describe, fix_for, retry_after
from evolve.llm.settings import LLMSettings
from evolve.store.calls import pack_vector, unpack_vector
from evolve.store.database import Store

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
    call. Otherwise the call reserves its expected cost against the budget (``Budget``;
    streamed and cut at ``max_tokens`` when there is a budget), takes one of
    its provider's ``llm.max_concurrency`` slots, waits out any rate limit the provider
    set for all calls, and is made with a per-call timeout; rate limits, timeouts,
    connection errors and 5xx are retried with exponential backoff (honouring
    Retry-After). Many calls may be awaited at once from one event loop.

    Embeddings (``embed``) take the same path: one text a call, keyed by the model and the
    text's hash, the vector recorded as the answer.

    Args:
        settings: the ``llm`` config group.
        store: the run's archive (``llm_calls`` lives there).
    """

    def __init__(self, settings: LLMSettings, *, store: Store) -> None:
        self.settings = settings
        self.ledger = Ledger(store, replay_from=settings.replay_from)
        self.budget = Budget(settings.max_cost_usd, self.ledger.spent())
        for model, (count, tokens) in self.ledger.answer_lengths().items():
            self.budget.observe(model, tokens, count=count)  # earlier sessions' answers count too
        self.lanes = Lanes(settings.max_concurrency)
        self._jitter = random.Random()
        self._priced: dict[str, bool] = {}
        self._running: dict[str, asyncio.Future[None]] = {}  # cache key -> ends with its call
        self.attempts = 0  # provider calls made by this client (cache hits excluded)
        self.waits: list[float] = []  # backoff sleeps, in order (for logs and tests)
        if settings.commands:
            register_command_provider(settings.commands)

    def spent(self) -> float:
        """USD spent on calls recorded in this archive (previous sessions of the run included)."""
        return self.budget.spent

    async def close(self) -> None:
        """End what the client started: every ``command`` provider process group, the replay archive."""
        await end_command_processes()
        self.ledger.close()

    # --- prices ------------------------------------------------------------------------------------

    def _litellm_prices(self, model: str) -> bool:
        """Whether litellm has a price for ``model`` (checked once per model)."""
        if model not in self._priced:
            try:
                cost_in, cost_out = litellm().cost_per_token(
                    model=model, prompt_tokens=1000, completion_tokens=1000
                )
                self._priced[model] = cost_in + cost_out > 0
            except Exception:
                self._priced[model] = False
        return self._priced[model]

    def _self_priced(self, model: str) -> bool:
        """evolve prices this model's calls (``llm.pricing``, or litellm has no price): litellm's
        own cost calculation and logging are not needed."""
        return self.settings.pricing is not None or not self._litellm_prices(model)

    def prompt_tokens(self, model: str, messages: Messages) -> int:
        """How many tokens ``messages`` are for ``model`` (litellm's count; a character estimate
        where it has none)."""
        try:
            return int(litellm().token_counter(model=model, messages=list(messages)))
        except Exception:
            return _estimated_tokens(messages)

    def priced(self, model: str, tokens_in: int, tokens_out: int) -> float:
        """What a call of ``model`` with these token counts costs (0 if unpriced)."""
        if self.settings.pricing is not None:
            return self.settings.pricing.cost(tokens_in, tokens_out)
        if not self._litellm_prices(model):
            return 0.0
        cost_in, cost_out = litellm().cost_per_token(
            model=model, prompt_tokens=tokens_in, completion_tokens=tokens_out
        )
        return float(cost_in + cost_out)

    def worst_case_cost(self, model: str, messages: Messages) -> float:
        """The most one call could cost: its prompt plus the answer cap as sent (0 if unpriced)."""
        return self.priced(model, self.prompt_tokens(model, messages), self.settings.answer_cap())

    def expected_cost(self, model: str, tokens_in: int) -> float:
        """What a call of ``model`` with a ``tokens_in`` prompt is expected to cost: the answer
        length typical of the run's calls of that model, at most the cap (``Budget``)."""
        answer = self.budget.typical_answer(model, self.settings.answer_cap())
        return self.priced(model, tokens_in, answer)

    def _cost(self, model: str, response: Any, tokens_in: int, tokens_out: int) -> float | None:
        if self.settings.pricing is not None:
            return self.settings.pricing.cost(tokens_in, tokens_out)
        if not self._litellm_prices(model):
            return None  # litellm has no price for this model: tokens only
        hidden = getattr(response, "_hidden_params", None) or {}
        if hidden.get("response_cost") is not None:
            return float(hidden["response_cost"])
        try:
            return float(litellm().completion_cost(completion_response=response, model=model))
        except Exception:
            return None

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
        call = _Call(
            model,
            messages,
            key=key,
            prompt_hash=prompt_hash,
            candidate=candidate,
            sample=sample,
            kwargs=self._call_kwargs(model, messages, sample),
        )
        return await self._answer(call, lambda: self.prompt_tokens(model, messages))

    async def embed(
        self, model: str, text: str, *, api_base: str | None = None, api_key_env: str | None = None
    ) -> tuple[float, ...]:
        """The embedding of ``text`` by ``model`` (litellm ``aembedding``), as float32 values.

        Recorded, served again, budgeted, limited and retried like ``complete``: the row holds
        the text's hash (``prompt_hash``) and the vector packed (``evolve.store.calls``), never
        the text; the vector returned is the stored one, so an offline replay computes the same
        similarities bit for bit.

        Args:
            model: a litellm embedding model string.
            text: what to embed.
            api_base: the embedding server's base URL (None: the provider's).
            api_key_env: environment variable holding the key to send.

        Raises:
            the errors of ``complete``.
        """
        digest = text_hash(text)
        kwargs: dict[str, Any] = {
            "model": model,
            "input": [text],
            "timeout": self.settings.timeout_s,
            "api_base": api_base,
        }
        if api_key_env:
            kwargs["api_key"] = os.environ.get(api_key_env, "")
        elif api_base:
            kwargs["api_key"] = "none"  # local servers usually take any key
        call = _Call(
            model,
            (),
            key=cache_key(model, (), {"embedding": True}, digest),
            prompt_hash=digest,
            candidate=None,
            sample=digest,
            kwargs=kwargs,
            text=text,
        )
        completion = await self._answer(call, lambda: self._embedding_tokens(model, text))
        return unpack_vector(completion.text)

    def _embedding_tokens(self, model: str, text: str) -> int:
        """How many tokens embedding ``text`` takes."""
        try:
            return int(litellm().token_counter(model=model, text=text))
        except Exception:
            return _estimated_tokens([{"content": text}])

    def _embedding_cost(self, model: str, tokens: int) -> float | None:
        """An embedding's cost at litellm's price (None: litellm has none; ``llm.pricing`` is for answers)."""
        if not self._litellm_prices(model):
            return None
        cost_in, _ = litellm().cost_per_token(
            model=model, prompt_tokens=tokens, completion_tokens=0
        )
        return float(cost_in)

    async def _answer(self, call: _Call, prompt_tokens: Callable[[], int]) -> Completion:
        """The recorded answer to ``call``, else one from the provider within the budget.

        The same request made while it is in flight waits for that call and is served its
        answer (an embedding asked by two proposals at once is paid once).
        """
        while (running := self._running.get(call.key)) is not None:
            await asyncio.wait([running])  # never cancels the call it waits for
        recorded = self.ledger.lookup(call.key, same_request=self.settings.offline)
        if recorded is not None:
            return self._recorded(call, recorded)
        if self.settings.offline:
            raise ReplayMiss(
                f"llm.offline=true and the archive holds no answer of {call.model} for this "
                f"{call.named()}; the replay ends here. "
                "Set llm.offline=false to call the model from this point on"
            )
        # Tokens are counted (tiktoken, ~1 ms a prompt) only when a budget needs them.
        tokens_in = prompt_tokens() if self.budget.limit is not None else 0

        def expected() -> float:  # asked again after each wait: the typical answer may change
            if call.text is not None:
                return self._embedding_cost(call.model, tokens_in) or 0.0
            return self.expected_cost(call.model, tokens_in)

        reserved = await self.budget.reserve(call.model, expected)
        self._running[call.key] = done = asyncio.get_running_loop().create_future()
        call.progress.tokens_in = tokens_in
        try:
            completion = await self._attempts(call)
            if call.text is None:
                self.budget.observe(call.model, completion.tokens_out)
            return completion
        finally:
            self.budget.settle(reserved, call.progress.cost)
            del self._running[call.key]
            done.set_result(None)

    def _recorded(self, call: _Call, recorded: Recorded) -> Completion:
        if recorded.truncated:
            log.warning(
                "%s: the recorded answer was stored cut (head and tail of a huge answer); serving it cut",
                call.model,
            )
        call_id = recorded.call_id
        if recorded.source != "archive":  # copy a replayed answer into this archive, at no cost
            call_id = self.ledger.record(
                call.record(
                    response=recorded.response,
                    tokens_in=recorded.tokens_in,
                    tokens_out=recorded.tokens_out,
                    cost=0.0,
                )
            )
        return Completion(
            text=recorded.response,
            model=call.model,
            tokens_in=recorded.tokens_in,
            tokens_out=recorded.tokens_out,
            cost=0.0,
            latency_s=0.0,
            cached=True,
            call_id=call_id,
        )

    async def _send(self, call: _Call) -> Any:
        """One request through litellm (quietly when evolve prices the call itself)."""
        kwargs = dict(call.kwargs)
        # a safety net over the provider's own timeout
        limit = self.settings.timeout_s + min(5.0, max(1.0, 0.1 * self.settings.timeout_s))
        if call.text is not None:  # an embedding: evolve always prices it (_embedding_cost)
            with quiet():
                return await asyncio.wait_for(litellm().aembedding(**kwargs), limit)
        if self._streamed(call.model):
            with quiet():
                return await asyncio.wait_for(self._stream(call, kwargs), limit)
        if not self._self_priced(call.model):
            return await asyncio.wait_for(litellm().acompletion(**kwargs), limit)
        # custom prices send litellm's own cost step down its short path (evolve prices the call)
        kwargs.update(input_cost_per_token=0.0, output_cost_per_token=0.0)
        with quiet():
            return await asyncio.wait_for(litellm().acompletion(**kwargs), limit)

    def _streamed(self, model: str) -> bool:
        """Whether calls of ``model`` are streamed: with a budget, over HTTP (a provider registered
        in-process, like ``command``, cannot stream and cuts its own answers)."""
        if self.budget.limit is None:
            return False
        custom = {entry.get("provider") for entry in litellm().custom_provider_map}
        return model.split("/", 1)[0] not in custom

    async def _stream(self, call: _Call, kwargs: dict[str, Any]) -> Any:
        """The answer streamed, cut as soon as it passes the answer cap (a server ignoring
        ``max_tokens`` is charged for what was received, at most a few tokens past the cap)."""
        lit = litellm()
        if self._self_priced(call.model):
            kwargs.update(input_cost_per_token=0.0, output_cost_per_token=0.0)
        if _reports_usage_when_streaming(call.model):  # else usage is counted from the chunks
            kwargs["stream_options"] = {"include_usage": True}
        stream = await lit.acompletion(**kwargs, stream=True)
        cap, progress = self.settings.answer_cap(), call.progress
        progress.tokens_out, chunks, text = 0, [], []
        try:
            async for chunk in stream:
                chunks.append(chunk)
                choices = getattr(chunk, "choices", None) or []
                delta = (
                    getattr(getattr(choices[0], "delta", None), "content", None)
                    if choices
                    else None
                )
                if delta:
                    text.append(delta)
                    progress.tokens_out += _counted(call.model, delta)
                    if progress.tokens_out > cap:
                        break
        finally:
            closing = getattr(stream, "aclose", None)
            if closing is not None:
                with contextlib.suppress(Exception):
                    await closing()
        response = lit.stream_chunk_builder(chunks, messages=list(call.messages))
        if response is None or progress.tokens_out > cap:  # cut: charged for what arrived
            response = lit.ModelResponse(
                model=call.model,
                choices=[
                    {
                        "index": 0,
                        "finish_reason": "length",
                        "message": {"role": "assistant", "content": "".join(text)},
                    }
                ],
                usage={
                    "prompt_tokens": progress.tokens_in,
                    "completion_tokens": progress.tokens_out,
                    "total_tokens": progress.tokens_in + progress.tokens_out,
                },
            )
        return response

    async def _attempts(self, call: _Call) -> Completion:
        tries = self.settings.retries + 1
        lane = Lanes.key(call.model, call.kwargs.get("api_base"))
        for attempt in range(tries):
            async with self.lanes.slot(lane):
                start = time.monotonic()
                self.attempts += 1
                row = self.ledger.begin(call.record())
                try:
                    response = await self._send(call)
                except asyncio.CancelledError:
                    self._record_cancelled(call, time.monotonic() - start, row)
                    raise
                except Exception as exc:
                    delay = self._delay(attempt, exc)
                    if _rate_limited(exc):  # held before the slot is released: no call slips in
                        self.lanes.hold(lane, delay)
                    self._failed(call, exc, attempt, tries, time.monotonic() - start, delay, row)
                else:
                    return self._success(call, response, latency=time.monotonic() - start, row=row)
            self.waits.append(delay)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    def _failed(
        self,
        call: _Call,
        exc: Exception,
        attempt: int,
        tries: int,
        latency: float,
        delay: float,
        row: int,
    ) -> None:
        """Record a failed attempt; raise unless it is retried (after ``delay``)."""
        error = describe(exc)
        self.ledger.record(call.record(error=error, status="error", latency_s=latency), row=row)
        kind = classify(exc)
        if kind == "fatal":
            setting = "llm.model" if call.text is None else "archive.novelty.embedding_model"
            raise LLMStop(f"{call.model}: {error}\n{fix_for(call.model, exc, setting)}") from exc
        if kind != "retry" or attempt + 1 >= tries:
            raise LLMCallFailed(
                f"{call.model}: {error} (attempt {attempt + 1} of {tries})"
            ) from exc
        log.warning(
            "%s: %s; retrying in %.1fs (attempt %d of %d)",
            call.model,
            error[:200],
            delay,
            attempt + 2,
            tries,
        )

    def _record_cancelled(self, call: _Call, latency: float, row: int) -> None:
        """A call ended by the run (Ctrl-C, SIGTERM, a cancelled task): recorded and charged for
        its prompt and what it streamed, as the provider may bill that."""
        streamed = self._streamed(call.model) and call.text is None
        tokens_in = call.progress.tokens_in or call.estimated_tokens()
        tokens_out = call.progress.tokens_out if streamed else 0
        cost = self.priced(call.model, tokens_in, tokens_out) if call.text is None else 0.0
        call.progress.cost += cost
        unknown = "" if streamed else ", answer tokens unknown"
        self.ledger.record(
            call.record(
                error=f"cancelled after {latency:.1f}s by the run; charged for the prompt and "
                f"{tokens_out} answer tokens received{unknown}",
                status="cancelled",
                latency_s=latency,
                tokens_in=tokens_in,
                tokens_out=tokens_out,
                cost=cost,
            ),
            row=row,
        )

    def _delay(self, attempt: int, exc: BaseException) -> float:
        backoff = min(self.settings.backoff_max_s, self.settings.backoff_s * 2**attempt)
        backoff *= 1 + 0.25 * self._jitter.random()
        asked = retry_after(exc)
        return min(MAX_RETRY_AFTER_S, max(backoff, asked)) if asked is not None else backoff

    def _success(self, call: _Call, response: Any, *, latency: float, row: int) -> Completion:
        usage = getattr(response, "usage", None)
        tokens_in = int(getattr(usage, "prompt_tokens", 0) or 0)
        tokens_out = int(getattr(usage, "completion_tokens", 0) or 0)
        if call.text is not None:
            (embedded,) = response.data  # one text a call
            text = pack_vector(embedded["embedding"])
            cost = self._embedding_cost(call.model, tokens_in)
        else:
            choices = getattr(response, "choices", None) or []
            message = getattr(choices[0], "message", None) if choices else None
            text = (getattr(message, "content", None) or "") if message is not None else ""
            cost = self._cost(call.model, response, tokens_in, tokens_out)
        call_id = self.ledger.record(
            call.record(
                response=text,
                tokens_in=tokens_in,
                tokens_out=tokens_out,
                cost=cost,
                latency_s=latency,
            ),
            row=row,
        )
        call.progress.cost += cost or 0.0
        cap = self.settings.answer_cap()
        if call.text is None and tokens_out > cap:
            if self._streamed(call.model):
                log.warning(
                    "%s ignored the answer cap (max_tokens=%d): the answer was cut after %d tokens",
                    call.model,
                    cap,
                    tokens_out,
                )
            else:
                why = (
                    f"{call.model} ignored the answer cap: it reported {tokens_out} completion tokens "
                    f"against max_tokens={cap}" + (f", costing ${cost:.4f}" if cost else "")
                )
                log.warning("%s; the call is recorded and charged as reported", why)
                self.budget.unbounded[call.model] = why
        return Completion(
            text=text,
            model=call.model,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            cost=cost,
            latency_s=latency,
            cached=False,
            call_id=call_id,
        )


@dataclass
class _Progress:
    """How far a call has got: its prompt's tokens, the answer tokens streamed in the current
    attempt, and the USD its attempts have been charged."""

    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0


@dataclass(frozen=True)
class _Call:
    """One request being made: what was asked (litellm's ``kwargs``) and how to record its attempts.

    ``text`` is set for an embedding (of that text), None for a chat answer.
    """

    model: str
    messages: Messages
    key: str
    prompt_hash: str
    candidate: str | None
    sample: str | int
    kwargs: Mapping[str, Any]
    text: str | None = None
    progress: _Progress = field(default_factory=lambda: _Progress())

    def named(self) -> str:
        """The request, as a replay that misses it names it."""
        if self.text is not None:
            return f"embedding input (text hash {self.prompt_hash[:12]})"
        return f"prompt (prompt {self.prompt_hash[:12]}, sample {self.sample})"

    def estimated_tokens(self) -> int:
        return _estimated_tokens(self.messages if self.text is None else [{"content": self.text}])

    def record(self, **fields: Any) -> CallRecord:
        return CallRecord(
            model=self.model,
            prompt_hash=self.prompt_hash,
            cache_key=self.key,
            messages=self.messages,
            candidate=self.candidate,
            **fields,
        )


def _estimated_tokens(messages: Messages) -> int:
    """About how many tokens the messages are (a character count over 3; no tokenizer)."""
    return sum(len(str(m.get("content", ""))) for m in messages) // 3


def _reports_usage_when_streaming(model: str) -> bool:
    """Whether litellm may send ``stream_options`` for ``model`` (an unsupported one is refused)."""
    try:
        supported = litellm().get_supported_openai_params(model=model) or []
    except Exception:
        return False
    return "stream_options" in supported


def _counted(model: str, text: str) -> int:
    """The tokens of a piece of streamed answer."""
    try:
        return max(1, int(litellm().token_counter(model=model, text=text)))
    except Exception:
        return max(1, len(text) // 3)


def _rate_limited(exc: BaseException) -> bool:
    return getattr(exc, "status_code", None) == 429 or isinstance(exc, litellm().RateLimitError)


def usage_line(summary: Mapping[str, Mapping[str, Any]]) -> str:
    """One line per model: calls, errors, tokens and USD (for the end-of-run log)."""
    lines = []
    for model, row in summary.items():
        cost = f"${row['cost']:.4f}" if row["cost"] else "no price"
        cancelled = f", {row['cancelled']} cancelled" if row.get("cancelled") else ""
        lines.append(
            f"{model}: {row['calls']} calls ({row['errors']} failed{cancelled}), {row['tokens_in']} tokens in, "
            f"{row['tokens_out']} out, {cost}"
        )
    return "\n".join(lines)
