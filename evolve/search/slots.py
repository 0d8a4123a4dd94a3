"""A backend's evaluation slots, lent to evaluations and given back as soon as each ends.

A slot is the number a backend maps to a device (a GPU group, a Ray worker). The driver
borrows one for a candidate's evaluation and its extra samples, and gives it back before the
candidate waits on anything else (a model's review of a would-be best), so that a slot is
never idle while a candidate is ready for it. Slots go to waiting borrowers in the order they
asked, except that a borrower asking ``first`` (a re-evaluation that a verdict waits for) is
served before every other.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator


class Slots:
    """``count`` evaluation slots, numbered 0 to ``count - 1``, lent one borrower at a time."""

    def __init__(self, count: int) -> None:
        self._free = deque(range(count))
        self._first: deque[asyncio.Future[int]] = deque()
        self._waiting: deque[asyncio.Future[int]] = deque()

    @contextlib.asynccontextmanager
    async def lent(self, *, first: bool = False) -> AsyncIterator[int]:
        """Borrow a slot for the block (waiting for one if none is free); ``first``: ahead of the queue."""
        slot = await self._take(first)
        try:
            yield slot
        finally:
            self._give_back(slot)

    async def _take(self, first: bool) -> int:
        if self._free and not (self._first or self._waiting):
            return self._free.popleft()
        future = asyncio.get_running_loop().create_future()
        (self._first if first else self._waiting).append(future)
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # handed over as it was cancelled
                self._give_back(future.result())
            raise

    def _give_back(self, slot: int) -> None:
        for queue in (self._first, self._waiting):
            while queue:
                future = queue.popleft()
                if not future.done():
                    future.set_result(slot)
                    return
        self._free.append(slot)
