"""Provider limits shared by every call of a client: calls in flight, and one wait after a rate limit."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

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

    A call reserves its worst case (prompt plus the answer cap sent, at the model's price)
    before it starts and settles to its real cost when it ends, so calls in flight together
    can never take the run past the limit. A model whose server ignored the answer cap has
    no worst case any more: with a limit set, its further calls are refused.
    """

    def __init__(self, limit: float | None, spent: float) -> None:
        self.limit = limit
        self.spent = spent
        self.reserved = 0.0
        self.unbounded: dict[str, str] = {}  # model -> why its cost has no bound

    def reserve(self, model: str, worst: float) -> None:
        """Reserve ``worst`` USD for a call of ``model``; raises BudgetExceeded if it might not fit."""
        if self.limit is None:
            return
        if model in self.unbounded:
            raise BudgetExceeded(
                f"{self.unbounded[model]}; with llm.max_cost_usd=${self.limit:g} no further call of {model} "
                "is made (its cost has no bound). Choose a server that honours max_tokens, or drop "
                "llm.max_cost_usd, and resume the run"
            )
        committed = self.spent + self.reserved
        if committed >= self.limit or committed + worst > self.limit:
            could = f"; the next call of {model} could cost up to {usd(worst)}" if worst else ""
            held = f" ({usd(self.reserved)} held by calls in flight)" if self.reserved else ""
            raise BudgetExceeded(
                f"LLM budget reached: {usd(self.spent)} spent{held} of llm.max_cost_usd=${self.limit:g}{could}; "
                "raise llm.max_cost_usd and resume the run to continue"
            )
        self.reserved += worst

    def settle(self, worst: float, cost: float) -> None:
        """A call that reserved ``worst`` ended having cost ``cost``."""
        if self.limit is not None:  # rounded: sums of float costs leave residues like -1e-21
            self.reserved = round(self.reserved - worst, 12)
        self.spent += cost


def usd(amount: float) -> str:
    """``amount`` in dollars, to four decimals, or two significant digits below a tenth of a cent."""
    return f"${amount:.4f}" if amount == 0 or abs(amount) >= 0.001 else f"${amount:.2g}"
