"""Provider limits shared by every call of a client: calls in flight, and one wait after a rate limit."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from evolve.llm.errors import BudgetExceeded


class Lanes:
    """Per provider (a server's base URL, else the model's provider prefix): a semaphore of
    ``max_concurrency`` slots and a *not before* time.

    When a call is rate limited, ``hold`` moves the provider's not-before time to when the
    server said it may be asked again; a call takes a slot and then waits for that time, so
    no call of that provider starts before it (one wait shared by all calls, not one retry
    each: a rate limit does not become a thundering herd).
    """

    def __init__(self, max_concurrency: int) -> None:
        self.max_concurrency = max_concurrency
        self._not_before: dict[str, float] = {}
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    @staticmethod
    def key(model: str, api_base: str | None) -> str:
        """The lane a model's calls share."""
        if api_base and not model.startswith("command/"):
            return api_base.rstrip("/")
        return model.split("/", 1)[0]

    def _semaphore(self, key: str) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a semaphore belongs to one event loop
            self._loop, self._slots = loop, {}
        if key not in self._slots:
            self._slots[key] = asyncio.Semaphore(self.max_concurrency)
        return self._slots[key]

    @contextlib.asynccontextmanager
    async def slot(self, key: str) -> AsyncIterator[None]:
        """Hold one of the provider's slots, entered once its not-before time has passed."""
        async with self._semaphore(key):
            while (wait := self._not_before.get(key, 0.0) - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            yield

    def hold(self, key: str, seconds: float) -> None:
        """No call of this provider starts in the next ``seconds``."""
        until = time.monotonic() + seconds
        self._not_before[key] = max(self._not_before.get(key, 0.0), until)


class Budget:
    """USD spent and reserved against ``llm.max_cost_usd``.

    A call reserves its *expected* cost before it starts (its prompt plus the answer length
    typical of the run's own calls of that model, never more than the answer cap; the cap
    itself until a model has answered) and settles to its real cost when it ends. A call
    that does not fit beside the calls in flight waits for them to settle; the budget is
    spent (``BudgetExceeded``) only when nothing is in flight and one more typical call
    would pass the limit. A call is cut at the answer cap, so calls in flight together can
    pass the limit by at most one worst-case call each (``llm.max_concurrency`` of them). A
    model whose server ignored the cap and could not be cut has no worst case any more:
    with a limit set, its further calls are refused.
    """

    def __init__(self, limit: float | None, spent: float) -> None:
        self.limit = limit
        self.spent = spent
        self.reserved = 0.0
        self.in_flight = 0
        self.unbounded: dict[str, str] = {}  # model -> why its cost has no bound
        self._answers: dict[str, tuple[int, int]] = {}  # model -> (answers seen, tokens in them)
        self._settled: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def observe(self, model: str, tokens_out: int, *, count: int = 1) -> None:
        """``count`` answers of ``model`` came with ``tokens_out`` answer tokens in all."""
        seen, total = self._answers.get(model, (0, 0))
        self._answers[model] = (seen + count, total + max(0, tokens_out))

    def typical_answer(self, model: str, cap: int) -> int:
        """The answer tokens to expect from ``model``: the mean of its answers so far, at most
        ``cap``; ``cap`` before it has answered."""
        count, total = self._answers.get(model, (0, 0))
        return cap if count == 0 else min(cap, -(-total // count))

    async def reserve(self, model: str, expected: Callable[[], float]) -> float:
        """Reserve the expected cost of a call of ``model`` (``expected()`` USD, asked again after
        each wait); returns the amount reserved.

        Raises:
            BudgetExceeded: nothing is in flight and the call would pass the limit.
        """
        if self.limit is None:
            self.in_flight += 1
            return 0.0
        while True:
            if model in self.unbounded:
                raise BudgetExceeded(
                    f"{self.unbounded[model]}; with llm.max_cost_usd=${self.limit:g} no further call of "
                    f"{model} is made (its cost has no bound). Choose a server that honours max_tokens, or "
                    "drop llm.max_cost_usd, and resume the run"
                )
            amount, committed = expected(), self.spent + self.reserved
            if committed < self.limit and committed + amount <= self.limit:
                self.reserved += amount
                self.in_flight += 1
                return amount
            if self.in_flight == 0:
                raise BudgetExceeded(
                    f"LLM budget reached: {usd(self.spent)} spent of llm.max_cost_usd=${self.limit:g}; "
                    f"the next call of {model} is expected to cost {usd(amount)}; "
                    "raise llm.max_cost_usd and resume the run to continue"
                )
            await self._wait_for_settle()

    async def _wait_for_settle(self) -> None:
        loop = asyncio.get_running_loop()  # an event belongs to one event loop
        if self._settled is None or self._settled.is_set() or self._loop is not loop:
            self._settled, self._loop = asyncio.Event(), loop
        await self._settled.wait()

    def settle(self, reserved: float, cost: float) -> None:
        """A call that reserved ``reserved`` ended having cost ``cost``; waiting calls look again."""
        self.in_flight -= 1
        if self.limit is not None:  # rounded: sums of float costs leave residues like -1e-21
            self.reserved = round(self.reserved - reserved, 12)
        self.spent += cost
        if self._settled is not None:
            self._settled.set()


def usd(amount: float) -> str:
    """``amount`` in dollars, to four decimals, or two significant digits below a tenth of a cent."""
    return f"${amount:.4f}" if amount == 0 or abs(amount) >= 0.001 else f"${amount:.2g}"
