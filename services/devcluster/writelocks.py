"""One write at a time per object: the read-check-admit-store sequence of a write is atomic.

A write reads the stored object, checks its preconditions (resourceVersion, uid), awaits
admission webhooks and only then stores. Without this, two writes of one object could both
pass the resourceVersion check while the webhook is called and both be stored: the second
would silently overwrite the first instead of answering 409 Conflict, as kube-apiserver
(whose storage compares the resourceVersion at commit) does. Serialising writes of the
same object gives that guarantee, and a patch without a precondition is applied to the
object as the previous write left it.
"""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import AsyncIterator, Hashable


class ObjectWriteLocks:
    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[asyncio.Lock, list[int]]] = {}

    @asynccontextmanager
    async def hold(self, key: Hashable) -> AsyncIterator[None]:
        entry = self._locks.get(key)
        if entry is None:
            entry = self._locks[key] = (asyncio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                self._locks.pop(key, None)

    def __len__(self) -> int:
        return len(self._locks)
