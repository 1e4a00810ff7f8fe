"""The store process's side of a multi-process devcluster: commits, the change stream, readiness.

The store process alone assigns resourceVersions, keeps the change history (the watch horizon)
and writes SQLite (``storage.Store``). Each API worker connects to its Unix socket, gets a
snapshot (objects and the kept history) and then every change in revision order, and commits
with compare-and-swap: ``Store.put``/``Store.delete`` with the worker's ``expect_rv``, answered
once durable. A worker's changes and answers share one connection, and the change is queued
before the answer, so a worker has applied its own write when it reads the answer.
"""
from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

from trainyard.errortext import describe

from .store import Change, StaleWrite, Store
from . import wire

log = logging.getLogger("trainyard.devcluster.storeserver")


class _Worker:
    """One connected API worker: its outgoing frames, flushed once per event-loop iteration."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.frames = wire.FrameWriter(writer)
        self.pending: list[Change] = []
        self.pid = 0

    def send(self, message: tuple[Any, ...]) -> None:
        self.flush_changes()
        self.frames.send(wire.encode(message))

    def flush_changes(self, encoded: dict[tuple[int, int], bytes] | None = None) -> None:
        """``encoded``: frames already made in this flush, by (first rv, count) — the workers'
        pending changes are runs of one sequence, so equal keys are equal frames."""
        if not self.pending:
            return
        batch, self.pending = self.pending, []
        key = (batch[0].rv, len(batch))
        frame = encoded.get(key) if encoded is not None else None
        if frame is None:
            frame = wire.encode(("changes", batch))
            if encoded is not None:
                encoded[key] = frame
        self.frames.send(frame)


class StoreServer:
    def __init__(self, store: Store, socket_path: Path) -> None:
        self.store = store
        self.socket_path = socket_path
        self._workers: set[_Worker] = set()
        self._server: asyncio.AbstractServer | None = None
        self._flush_scheduled = False
        self.ready: asyncio.Queue[int] = asyncio.Queue()  # pids of workers serving HTTPS
        store.subscribers.append(self._on_change)

    async def start(self) -> None:
        self.socket_path.unlink(missing_ok=True)
        old_mask = os.umask(0o177)  # the socket is the store's owner's alone (mode 0600)
        try:
            self._server = await asyncio.start_unix_server(self._serve, path=str(self.socket_path),
                                                           limit=wire.MAX_FRAME)
        finally:
            os.umask(old_mask)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for worker in list(self._workers):
                worker.writer.close()
            await self._server.wait_closed()
        self.socket_path.unlink(missing_ok=True)

    def _on_change(self, change: Change) -> None:
        for worker in self._workers:
            worker.pending.append(change)
        if not self._flush_scheduled and self._workers:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        encoded: dict[tuple[int, int], bytes] = {}  # each batch pickled once for all workers
        for worker in self._workers:
            worker.flush_changes(encoded)

    def _snapshot(self) -> tuple[Any, ...]:
        store = self.store
        objects = [(key, ns, name, stored.rv, stored.raw)
                   for key in store.keys() for (ns, name), stored in store.list(key)]
        return ("snapshot", store.rv, store.oldest_kept, objects, store.changes_since(store.oldest_kept))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        worker = _Worker(writer)
        # the snapshot and the subscription in one step: no change falls between them
        worker.frames.send(wire.encode(self._snapshot()))
        self._workers.add(worker)
        try:
            while True:
                message = await wire.read(reader)
                if message is None:
                    break
                self._handle(worker, message)
        except (ConnectionError, wire.ProtocolError) as err:
            log.warning("API worker %s: connection ended: %s", worker.pid or "?", describe(err))
        finally:
            self._workers.discard(worker)
            writer.close()

    def _handle(self, worker: _Worker, message: tuple[Any, ...]) -> None:
        verb = message[0]
        if verb == "rv":
            worker.send(("rv", message[1], self.store.rv))
        elif verb in ("put", "del"):
            _, request_id, key, namespace, name, obj, expect_rv = message
            try:
                if verb == "put":
                    stored = self.store.put(tuple(key), namespace, name, obj, expect_rv)
                else:
                    stored = self.store.delete(tuple(key), namespace, name, obj, expect_rv)
            except StaleWrite as stale:
                current = stale.current
                worker.send(("stale", request_id, current.rv if current else 0, current.raw if current else b""))
                return
            except KeyError:
                worker.send(("stale", request_id, 0, b""))
                return
            asyncio.get_running_loop().create_task(self._answer_when_durable(worker, request_id, stored.rv, stored.raw))
        elif verb == "ready":
            worker.pid = int(message[1])
            self.ready.put_nowait(worker.pid)
        else:
            raise wire.ProtocolError(f"unknown request {verb!r}")

    async def _answer_when_durable(self, worker: _Worker, request_id: int, rv: int, raw: bytes) -> None:
        try:
            await self.store.durable(rv)
        except RuntimeError as err:
            worker.send(("failed", request_id, str(err)))
            return
        if not worker.writer.is_closing():
            worker.send(("ok", request_id, rv, raw))
