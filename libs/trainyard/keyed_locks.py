"""Per-key asyncio locks that exist only while someone holds or waits for them.

Used wherever work on one object must not interleave with other work on the same object
(devcluster's writes of one object; the dispatcher's passes over one TrainJob), while work
on different objects runs concurrently.
"""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import AsyncIterator, Hashable


class KeyedLocks:
    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[asyncio.Lock, list[int]]] = {}

    @asynccontextmanager
    async def hold(self, key: Hashable) -> AsyncIterator[None]:
        entry = self._locks.get(key)
        if entry is None:
            entry = self._locks[key] = (asyncio.Lock(), [0])
        lock, users = entry
        users[0] += 1  # counted before waiting: the entry outlives the holder while others wait
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                self._locks.pop(key, None)

    def __len__(self) -> int:
        return len(self._locks)
