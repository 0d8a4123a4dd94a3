"""The evaluation slots: lent in the order asked, re-evaluations first, none lost to a cancelled borrower."""

from __future__ import annotations

import asyncio

from evolve.search.slots import Slots


async def _borrow(slots: Slots, name: str, order: list[str], release: asyncio.Event, **kw) -> None:
    async with slots.lent(**kw) as slot:
        order.append(f"{name}:{slot}")
        await release.wait()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_slots_go_to_waiting_borrowers_in_order_with_first_ones_ahead() -> None:
    async def scenario() -> list[str]:
        slots, order = Slots(1), []
        gates = {name: asyncio.Event() for name in "abcd"}
        tasks = [asyncio.create_task(_borrow(slots, "a", order, gates["a"]))]
        await _settle()
        tasks.append(asyncio.create_task(_borrow(slots, "b", order, gates["b"])))
        await _settle()
        tasks.append(asyncio.create_task(_borrow(slots, "c", order, gates["c"])))
        await _settle()
        tasks.append(asyncio.create_task(_borrow(slots, "d", order, gates["d"], first=True)))
        await _settle()
        assert order == ["a:0"]  # one slot: the others wait
        for name in "adbc":
            gates[name].set()
            await _settle()
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == ["a:0", "d:0", "b:0", "c:0"]


def test_free_slots_are_lent_at_once_each_to_one_borrower() -> None:
    async def scenario() -> list[str]:
        slots, order, release = Slots(3), [], asyncio.Event()
        tasks = [asyncio.create_task(_borrow(slots, n, order, release)) for n in "xyz"]
        await _settle()
        release.set()
        await asyncio.gather(*tasks)
        return order

    assert sorted(asyncio.run(scenario())) == ["x:0", "y:1", "z:2"]


def test_a_borrower_cancelled_while_waiting_or_as_it_is_served_loses_no_slot() -> None:
    async def scenario() -> list[str]:
        slots, order = Slots(1), []
        hold, never = asyncio.Event(), asyncio.Event()
        holder = asyncio.create_task(_borrow(slots, "holder", order, hold))
        await _settle()
        waiting = asyncio.create_task(_borrow(slots, "waiting", order, never))
        await _settle()
        waiting.cancel()  # cancelled while it waits
        await _settle()
        served = asyncio.create_task(_borrow(slots, "served", order, never))
        await _settle()
        hold.set()  # the slot is handed to "served"...
        served.cancel()  # ...which is cancelled before it runs again: the slot comes back
        await asyncio.gather(holder, waiting, served, return_exceptions=True)
        async with slots.lent() as slot:
            order.append(f"after:{slot}")
        return order

    assert asyncio.run(scenario()) == ["holder:0", "after:0"]
