"""A replica's handler slots follow its CPU limit: the share of handlers and of pulled messages
per core, and a capacity that changes while handlers run."""
from __future__ import annotations

import asyncio

import pytest

from trainyard.bus import partitions
from trainyard.bus.partitions import HandlerSlots, handler_slots, pull_batch


def test_slots_and_pulls_scale_with_the_cpu_limit() -> None:
    assert handler_slots(None) == partitions.REPLICA_CONCURRENCY
    assert handler_slots(1.0) == partitions.REPLICA_CONCURRENCY
    assert handler_slots(4.0) == partitions.REPLICA_CONCURRENCY
    assert handler_slots(0.5) == 16
    assert handler_slots(0.03) == partitions.MIN_SLOTS
    # Unlimited: the whole credit as before (at least MIN_BATCH a pull).
    assert pull_batch(16, 1) == 16 and pull_batch(1, 1) == 128
    # 0.03 CPU holding 16 partitions: a message per request, 32 buffered at most.
    assert pull_batch(16, 1, 0.03) == 1
    assert pull_batch(1, 1, 0.03) == 4  # 8 messages of credit, two requests outstanding
    assert pull_batch(1, 1, 0.5) == 64


async def test_a_smaller_capacity_applies_as_handlers_finish_a_larger_one_at_once() -> None:
    slots = HandlerSlots(4)
    running, most = 0, 0
    release = asyncio.Event()

    async def handler() -> None:
        nonlocal running, most
        async with slots:
            running += 1
            most = max(most, running)
            await release.wait()
            await asyncio.sleep(0)
            running -= 1

    tasks = [asyncio.create_task(handler()) for _ in range(10)]
    await asyncio.sleep(0.01)
    assert (running, slots.busy) == (4, 4)
    slots.resize(2)  # nothing is taken away from running handlers
    assert running == 4
    release.set()
    await asyncio.sleep(0.05)
    assert running == 0 and most == 4 and all(t.done() for t in tasks)

    release.clear()
    most = 0
    tasks = [asyncio.create_task(handler()) for _ in range(6)]
    await asyncio.sleep(0.01)
    assert running == 2  # the new capacity
    slots.resize(5)
    await asyncio.sleep(0.01)
    assert running == 5  # waiters woken at once
    release.set()
    await asyncio.gather(*tasks)
    assert slots.busy == 0


async def test_a_cancelled_waiter_gives_its_slot_on() -> None:
    slots = HandlerSlots(1)
    order: list[str] = []
    gate = asyncio.Event()

    async def holder() -> None:
        async with slots:
            await gate.wait()

    async def waiter(name: str) -> None:
        async with slots:
            order.append(name)

    first = asyncio.create_task(holder())
    await asyncio.sleep(0)
    cancelled = asyncio.create_task(waiter("cancelled"))
    kept = asyncio.create_task(waiter("kept"))
    await asyncio.sleep(0)
    gate.set()
    await asyncio.sleep(0)  # the holder leaves and hands the slot to the first waiter...
    cancelled.cancel()  # ...which is cancelled before it runs
    await first
    await kept
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert order == ["kept"] and slots.busy == 0
