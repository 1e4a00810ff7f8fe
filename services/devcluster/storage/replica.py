"""An API worker's store: a replica of the store process's objects, fed by its change stream.

``Replica`` is a ``Store`` without SQLite: reads, lists, the owner index, the change history
and watches are served from memory as in one process, in the store process's revision order.
Writes go to the store process (``write``/``remove``: compare-and-swap there) and return once
this replica has applied the change, so the writer's own next read sees it. ``sync`` asks the
store process for its resourceVersion and waits until the replica has reached it: a request
that starts after another client's write finished — through any worker — sees that write.
State derived from stored objects in every worker (the CRD registry) follows the stream
through ``on_change`` callbacks.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import logging
from pathlib import Path
from typing import Any, Callable

from .store import Change, Key, StaleWrite, Store, StoredObject, _labels, _owners
from . import wire

log = logging.getLogger("trainyard.devcluster.replica")


def _stored(rv: int, raw: bytes) -> StoredObject:
    obj = json.loads(raw)
    return StoredObject(rv, raw, _labels(obj), _owners(obj))


class Replica(Store):
    def __init__(self, data_dir: Path, socket_path: Path, history_size: int = 4096) -> None:
        self._init_memory(data_dir, history_size)
        self.socket_path = socket_path
        self._reader: asyncio.StreamReader | None = None
        self._frames: wire.FrameWriter | None = None
        self._ids = itertools.count(1)
        self._answers: dict[int, asyncio.Future[tuple[Any, ...]]] = {}
        self._rv_waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._follow: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()  # the store process is gone (or the replica was closed)
        self.on_change: list[Callable[[Change], None]] = []
        self._next_sync: asyncio.Future[None] | None = None  # callers of sync() for the next question
        self._syncing: asyncio.Task[None] | None = None

    # ---- connecting

    async def connect(self) -> None:
        """Connect, load the snapshot, and follow the stream in the background."""
        self._loop = asyncio.get_running_loop()
        self._reader, writer = await asyncio.open_unix_connection(str(self.socket_path), limit=wire.MAX_FRAME)
        self._frames = wire.FrameWriter(writer)
        snapshot = await wire.read(self._reader)
        if snapshot is None or snapshot[0] != "snapshot":
            raise wire.ProtocolError("the store process did not send a snapshot")
        _, rv, oldest_kept, objects, history = snapshot
        for key, namespace, name, obj_rv, raw in objects:
            stored = _stored(obj_rv, raw)
            self._objects.setdefault(tuple(key), {})[(namespace, name)] = stored
            self._index_owners(tuple(key), namespace, name, (), stored.owners)
        self._history = list(history)
        self.rv = rv
        self._oldest_kept = oldest_kept
        self._durable_rv = rv
        self._follow = asyncio.create_task(self._follow_stream())

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop  # no SQLite writer: the store process has it

    async def close(self) -> None:
        if self._frames is not None:
            self._frames.close()
        if self._follow is not None:
            self._follow.cancel()
        self.closed.set()

    async def announce_ready(self, pid: int) -> None:
        self._send(("ready", pid))

    # ---- the stream

    async def _follow_stream(self) -> None:
        assert self._reader is not None
        try:
            while True:
                message = await wire.read(self._reader)
                if message is None:
                    log.warning("the store process closed the connection")
                    break
                if message[0] == "changes":
                    for change in message[1]:
                        self._apply(change)
                else:
                    future = self._answers.pop(message[1], None)
                    if future is not None and not future.done():
                        future.set_result(message)
        except (ConnectionError, wire.ProtocolError) as err:
            log.error("the store process's stream failed: %s", err)
        finally:
            for future in self._answers.values():
                if not future.done():
                    future.set_exception(ConnectionError("the store process is gone"))
            self._answers.clear()
            self.closed.set()

    def _apply(self, change: Change) -> None:
        """One change of the store process, at its resourceVersion."""
        key = change.key
        bucket = self._objects.setdefault(key, {})
        old = bucket.get((change.namespace, change.name))
        if change.type == "DELETED":
            bucket.pop((change.namespace, change.name), None)
            self._index_owners(key, change.namespace, change.name, old.owners if old else (), ())
        else:  # labels and owners come with the change: no JSON decoding per change and worker
            stored = StoredObject(change.rv, change.raw, change.labels, change.owners)
            bucket[(change.namespace, change.name)] = stored
            self._index_owners(key, change.namespace, change.name, old.owners if old else (), stored.owners)
        self.rv = change.rv
        self._durable_rv = change.rv
        self._changed[key] = change.rv
        self._record(change)
        for callback in self.on_change:
            callback(change)
        while self._rv_waiters and self._rv_waiters[0][0] <= self.rv:
            _, _, future = heapq.heappop(self._rv_waiters)
            if not future.done():
                future.set_result(None)

    async def reach(self, rv: int) -> None:
        """Wait until this replica has applied the change at ``rv``."""
        if self.rv >= rv:
            return
        if self.closed.is_set():
            raise ConnectionError("the store process is gone")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._rv_waiters, (rv, id(future), future))
        await future

    # ---- requests to the store process

    def _send(self, message: tuple[Any, ...]) -> None:
        if self._frames is None or self.closed.is_set():
            raise ConnectionError("the store process is gone")
        self._frames.send(wire.encode(message))

    async def _ask(self, verb: str, *args: Any) -> tuple[Any, ...]:
        request_id = next(self._ids)
        future: asyncio.Future[tuple[Any, ...]] = asyncio.get_running_loop().create_future()
        self._answers[request_id] = future
        self._send((verb, request_id, *args))
        return await future

    async def sync(self) -> None:
        """Requests that arrive while a question is out share the next one (asked after they
        arrived, so it covers every write finished before them): one round trip per batch."""
        if self._next_sync is None:
            self._next_sync = asyncio.get_running_loop().create_future()
        waiter = self._next_sync
        if self._syncing is None:
            self._syncing = asyncio.create_task(self._sync_batches())
        await asyncio.shield(waiter)  # one caller going away does not cancel the others' answer

    async def _sync_batches(self) -> None:
        try:
            while self._next_sync is not None:
                batch, self._next_sync = self._next_sync, None
                try:
                    answer = await self._ask("rv")
                    await self.reach(answer[2])
                except (ConnectionError, RuntimeError) as err:
                    batch.set_exception(ConnectionError(f"the store process is gone: {err}"))
                else:
                    batch.set_result(None)
        finally:
            self._syncing = None

    async def write(self, key: Key, namespace: str, name: str, obj: dict[str, Any], expect_rv: int | None = None
                    ) -> StoredObject:
        return await self._commit("put", key, namespace, name, obj, expect_rv)

    async def remove(self, key: Key, namespace: str, name: str, last_state: dict[str, Any],
                     expect_rv: int | None = None) -> StoredObject:
        return await self._commit("del", key, namespace, name, last_state, expect_rv)

    async def _commit(self, verb: str, key: Key, namespace: str, name: str, obj: dict[str, Any],
                      expect_rv: int | None) -> StoredObject:
        answer = await self._ask(verb, key, namespace, name, obj, expect_rv)
        if answer[0] == "stale":
            raise StaleWrite(_stored(answer[2], answer[3]) if answer[2] else None)
        if answer[0] == "failed":
            raise RuntimeError(answer[2])
        _, _, rv, raw = answer
        await self.reach(rv)
        obj.setdefault("metadata", {})["resourceVersion"] = str(rv)
        return StoredObject(rv, raw, _labels(obj), _owners(obj) if verb == "put" else ())

    def put(self, key: Key, namespace: str, name: str, obj: dict[str, Any], expect_rv: int | None = None
            ) -> StoredObject:
        raise RuntimeError("an API worker writes through the store process (await write)")

    def delete(self, key: Key, namespace: str, name: str, last_state: dict[str, Any], expect_rv: int | None = None
               ) -> StoredObject:
        raise RuntimeError("an API worker removes through the store process (await remove)")

    async def durable(self, rv: int) -> None:
        """The store process answers a commit once it is durable; a worker has nothing to wait for."""
