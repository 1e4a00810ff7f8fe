"""Object storage: SQLite (WAL) is the durable source, an in-memory index serves reads.

Every write takes the next value of one global resourceVersion and lands in memory at once
(so reads and watches see it immediately); a writer thread commits batches of writes to SQLite
and the request answers only after its write is durable (group commit: many writes, one fsync).
Watches read a bounded in-memory change history; older resourceVersions answer 410 Expired.
"""
from __future__ import annotations

import asyncio
import fcntl
import heapq
import json
import logging
import os
import queue
import sqlite3
import threading
from pathlib import Path
from typing import Any, Callable, NamedTuple

from trainyard.errortext import describe
from .datadir import DB_NAME, KNOWN_ENTRIES, LOCK_NAME

log = logging.getLogger("trainyard.devcluster.storage")

FORMAT = "trainyard-devcluster/1"

Key = tuple[str, str]  # (group, resource)


class DataDirError(Exception):
    """The data dir is corrupt or belongs to something else: never reset it silently."""


class StaleWrite(Exception):
    """A compare-and-swap commit found the object changed (``current``) or gone (None)."""

    def __init__(self, current: StoredObject | None) -> None:
        super().__init__("the object changed since it was read" if current is not None else "the object is gone")
        self.current = current


class StoredObject(NamedTuple):
    rv: int
    raw: bytes  # the object's compact JSON
    labels: dict[str, str]
    owners: tuple[str, ...] = ()  # uids named in metadata.ownerReferences

    def load(self) -> dict[str, Any]:
        return json.loads(self.raw)


class Change(NamedTuple):
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    key: Key
    namespace: str
    name: str
    raw: bytes
    old_raw: bytes | None
    labels: dict[str, str]
    old_labels: dict[str, str] | None
    owners: tuple[str, ...] = ()  # the new object's owner uids (an API worker's replica indexes them)


class Expired(Exception):
    def __init__(self, requested: int, oldest: int) -> None:
        super().__init__(f"too old resource version: {requested} ({oldest})")
        self.requested = requested
        self.oldest = oldest


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def _owners(obj: dict[str, Any]) -> tuple[str, ...]:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return tuple(str(r.get("uid")) for r in refs if isinstance(r, dict) and r.get("uid"))


class Store:
    def __init__(self, data_dir: Path, history_size: int = 4096) -> None:
        self._init_memory(data_dir, history_size)
        self._lock_file = self._lock_data_dir()
        self._conn = self._open_db()
        self._load()

    def _init_memory(self, data_dir: Path, history_size: int) -> None:
        """The in-memory index, history and waiters (a worker's replica has these alone)."""
        self.data_dir = data_dir
        self.history_size = max(1, history_size)
        self._objects: dict[Key, dict[tuple[str, str], StoredObject]] = {}
        self._dependents: dict[str, set[tuple[Key, str, str]]] = {}  # owner uid -> dependents
        self._history: list[Change] = []
        self._changed: dict[Key, int] = {}  # kind -> resourceVersion of its last write or delete
        self.rv = 0
        self._oldest_kept = 0  # the watch horizon: changes with rv > this are kept
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: list[asyncio.Future[None]] = []
        self._durable_rv = 0
        self._durable_waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = 0
        # SimpleQueue: put() is one C call, no Condition to notify (it ran on every loop iteration)
        self._queue: queue.SimpleQueue[list[tuple] | None] = queue.SimpleQueue()
        self._pending: list[tuple] = []  # writes of this loop iteration, handed over in one go
        self._flush_scheduled = False
        self._writer: threading.Thread | None = None
        self._writer_error: BaseException | None = None
        # called with each change as it is recorded (the store process streams them to workers)
        self.subscribers: list[Callable[[Change], None]] = []

    # ---- opening and loading

    def _lock_data_dir(self) -> Any:
        """One server per data dir: a second one would fork the state (an exclusive flock)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        db_exists = (self.data_dir / DB_NAME).exists()
        foreign = [p.name for p in self.data_dir.iterdir() if p.name not in KNOWN_ENTRIES]
        if not db_exists and foreign:
            return None  # reported as a foreign data dir by _open_db, without leaving a lock file
        handle = (self.data_dir / LOCK_NAME).open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            owner = handle.read().strip() or "unknown"
            handle.close()
            raise DataDirError(f"data dir {self.data_dir} is in use by another devcluster (pid {owner})") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        return handle

    def _open_db(self) -> sqlite3.Connection:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        db_path = self.data_dir / DB_NAME
        if not db_path.exists():
            foreign = sorted(p.name for p in self.data_dir.iterdir() if p.name not in KNOWN_ENTRIES)
            if foreign:
                raise DataDirError(
                    f"data dir {self.data_dir} is not a trainyard devcluster data dir "
                    f"(it holds {', '.join(foreign[:5])}); choose an empty or devcluster directory")
        try:
            conn = sqlite3.connect(db_path, check_same_thread=False, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if not tables:
                conn.execute("BEGIN")
                conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
                conn.execute(
                    "CREATE TABLE objects (grp TEXT NOT NULL, resource TEXT NOT NULL, namespace TEXT NOT NULL,"
                    " name TEXT NOT NULL, rv INTEGER NOT NULL, data BLOB NOT NULL,"
                    " PRIMARY KEY (grp, resource, namespace, name)) WITHOUT ROWID")
                conn.execute("INSERT INTO meta VALUES ('format', ?), ('rv', '0')", (FORMAT,))
                conn.execute("COMMIT")
            elif "meta" not in tables or "objects" not in tables:
                raise DataDirError(f"{db_path} is a SQLite database but not a trainyard devcluster store")
            row = conn.execute("SELECT value FROM meta WHERE key='format'").fetchone()
            if not row or row[0] != FORMAT:
                raise DataDirError(f"{db_path} has storage format {row[0] if row else None!r}, expected {FORMAT!r}")
            return conn
        except sqlite3.DatabaseError as err:
            raise DataDirError(f"{db_path} is corrupt or not a SQLite database: {err}") from err

    def _load(self) -> None:
        try:
            row = self._conn.execute("SELECT value FROM meta WHERE key='rv'").fetchone()
            self.rv = int(row[0]) if row else 0
            for grp, resource, namespace, name, rv, data in self._conn.execute(
                    "SELECT grp, resource, namespace, name, rv, data FROM objects"):
                raw = bytes(data)
                obj = json.loads(raw)
                stored = StoredObject(rv, raw, _labels(obj), _owners(obj))
                self._objects.setdefault((grp, resource), {})[(namespace, name)] = stored
                self._index_owners((grp, resource), namespace, name, (), stored.owners)
        except (sqlite3.DatabaseError, ValueError) as err:
            raise DataDirError(f"{self.data_dir / DB_NAME} is corrupt: {err}") from err
        self._oldest_kept = self.rv
        self._durable_rv = self.rv

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._writer = threading.Thread(target=self._write_loop, name="devcluster-sqlite-writer", daemon=True)
        self._writer.start()

    async def close(self) -> None:
        self._flush()
        if self._writer is not None:
            self._queue.put(None)
            await asyncio.get_running_loop().run_in_executor(None, self._writer.join)
            self._writer = None
        self._conn.close()
        if self._lock_file is not None:
            self._lock_file.close()  # releases the flock

    # ---- reads

    def get(self, key: Key, namespace: str, name: str) -> StoredObject | None:
        return self._objects.get(key, {}).get((namespace, name))

    def list(self, key: Key, namespace: str | None = None) -> list[tuple[tuple[str, str], StoredObject]]:
        bucket = self._objects.get(key, {})
        if namespace is None:
            items = list(bucket.items())
        else:
            items = [(k, v) for k, v in bucket.items() if k[0] == namespace]
        items.sort(key=lambda kv: kv[0])
        return items

    def count(self, key: Key) -> int:
        return len(self._objects.get(key, {}))

    def keys(self) -> list[Key]:
        return [k for k, v in self._objects.items() if v]

    @property
    def oldest_kept(self) -> int:
        """The watch horizon: changes after this resourceVersion are kept."""
        return self._oldest_kept

    def changed_at(self, key: Key) -> int:
        """The resourceVersion of the last write or delete of an object of kind ``key`` by this
        process (0: none yet): it changes exactly when the kind's objects change."""
        return self._changed.get(key, 0)

    # ---- writes (called on the event loop; never block)

    def put(self, key: Key, namespace: str, name: str, obj: dict[str, Any], expect_rv: int | None = None
            ) -> StoredObject:
        """Store ``obj`` under the next resourceVersion (set into ``obj``) and record the change.

        ``expect_rv``: compare-and-swap, as kube-apiserver's storage commits: only if the stored
        object is still at that resourceVersion (0: only if there is none), else ``StaleWrite``.
        The check and the write happen without yielding to the event loop, so every writer
        (requests, the garbage collector, the namespace controller) gets one order per object."""
        bucket = self._objects.setdefault(key, {})
        old = bucket.get((namespace, name))
        if expect_rv is not None and (old.rv if old is not None else 0) != expect_rv:
            raise StaleWrite(old)
        self.rv += 1
        self._changed[key] = self.rv
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        raw = dumps(obj)
        stored = StoredObject(self.rv, raw, _labels(obj), _owners(obj))
        bucket[(namespace, name)] = stored
        self._index_owners(key, namespace, name, old.owners if old else (), stored.owners)
        self._record(Change(self.rv, "MODIFIED" if old else "ADDED", key, namespace, name, raw,
                            old.raw if old else None, stored.labels, old.labels if old else None, stored.owners))
        self._enqueue(("put", key[0], key[1], namespace, name, self.rv, raw))
        return stored

    def delete(self, key: Key, namespace: str, name: str, last_state: dict[str, Any], expect_rv: int | None = None
               ) -> StoredObject:
        """Remove the object; the DELETED event carries ``last_state`` at a new resourceVersion.

        ``expect_rv``: compare-and-swap as in ``put``: only if the stored object is still at that
        resourceVersion, else ``StaleWrite`` (with the current object, or None when it is gone)."""
        bucket = self._objects.get(key, {})
        current = bucket.get((namespace, name))
        if current is None or (expect_rv is not None and current.rv != expect_rv):
            if expect_rv is None:
                raise KeyError((key, namespace, name))
            raise StaleWrite(current)
        old = bucket.pop((namespace, name))
        self._index_owners(key, namespace, name, old.owners, ())
        self.rv += 1
        self._changed[key] = self.rv
        last_state.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        raw = dumps(last_state)
        self._record(Change(self.rv, "DELETED", key, namespace, name, raw, old.raw, _labels(last_state), old.labels))
        self._enqueue(("del", key[0], key[1], namespace, name, self.rv, None))
        return StoredObject(self.rv, raw, _labels(last_state))

    # ---- the asynchronous interface every writer uses: here the local store, in an API worker
    # of a multi-process devcluster the store process over its socket (``replica.py``)

    async def write(self, key: Key, namespace: str, name: str, obj: dict[str, Any], expect_rv: int | None = None
                    ) -> StoredObject:
        """``put``; here it never yields, so a check before it and the write are one step."""
        return self.put(key, namespace, name, obj, expect_rv)

    async def remove(self, key: Key, namespace: str, name: str, last_state: dict[str, Any],
                     expect_rv: int | None = None) -> StoredObject:
        return self.delete(key, namespace, name, last_state, expect_rv)

    async def sync(self) -> None:
        """Wait until this process's view holds every write committed before the call (a read
        after a client's own write sees it). One process: always."""

    def _enqueue(self, op: tuple) -> None:
        """Collect writes; the writer thread is woken once per event-loop iteration, not per write."""
        self._pending.append(op)
        if self._loop is None:
            self._flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        batch, self._pending = self._pending, []
        if batch:
            self._queue.put(batch)

    def _index_owners(self, key: Key, namespace: str, name: str, old: tuple[str, ...], new: tuple[str, ...]) -> None:
        if old == new:
            return
        ref = (key, namespace, name)
        for uid in old:
            deps = self._dependents.get(uid)
            if deps is not None:
                deps.discard(ref)
                if not deps:
                    del self._dependents[uid]
        for uid in new:
            self._dependents.setdefault(uid, set()).add(ref)

    def dependents(self, owner_uid: str) -> list[tuple[Key, str, str]]:
        """Objects whose ownerReferences name ``owner_uid``."""
        return sorted(self._dependents.get(owner_uid, ()))

    def _record(self, change: Change) -> None:
        self._history.append(change)
        for subscriber in self.subscribers:
            subscriber(change)
        if len(self._history) > self.history_size * 2 or len(self._history) > self.history_size + 1024:
            self.compact(self.history_size)
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def compact(self, keep: int) -> None:
        """Forget all but the newest ``keep`` changes (watches from before them get 410)."""
        drop = max(0, len(self._history) - keep)
        if drop:
            self._oldest_kept = self._history[drop - 1].rv
            del self._history[:drop]
        elif keep == 0:
            self._oldest_kept = self.rv

    # ---- watch support

    def changes_since(self, rv: int) -> list[Change]:
        """Changes with resourceVersion > rv; Expired when rv is older than the kept history."""
        if rv < self._oldest_kept:
            raise Expired(rv, self._oldest_kept)
        if not self._history or rv >= self.rv:
            return []
        first = self._history[0].rv
        return self._history[max(0, rv + 1 - first):]

    async def wait_for_change(self, after_rv: int, timeout: float) -> None:
        if self.rv > after_rv:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            pass

    def wake_all(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    # ---- durability

    async def durable(self, rv: int) -> None:
        """Wait until every write up to ``rv`` is committed to SQLite."""
        if self._writer_error is not None:
            raise RuntimeError(f"storage writer failed: {describe(self._writer_error)}")
        if rv <= self._durable_rv:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._seq += 1
        heapq.heappush(self._durable_waiters, (rv, self._seq, fut))
        await fut

    def _mark_durable(self, rv: int, error: BaseException | None) -> None:
        if error is not None:
            self._writer_error = error
        self._durable_rv = max(self._durable_rv, rv)
        while self._durable_waiters and (self._durable_waiters[0][0] <= self._durable_rv or error):
            _, _, fut = heapq.heappop(self._durable_waiters)
            if not fut.done():
                if error is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(RuntimeError(f"storage writer failed: {describe(error)}"))

    def _write_loop(self) -> None:
        conn = self._conn
        stop = False
        while not stop:
            batches = [self._queue.get()]
            while True:
                try:
                    batches.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if None in batches:
                stop = True
            ops = [op for batch in batches if batch is not None for op in batch]
            if not ops:
                continue
            top = max(op[5] for op in ops)
            latest: dict[tuple, tuple] = {}
            for op in ops:  # only the last write of each key matters for the stored state
                latest[op[1:5]] = op
            puts = [op[1:7] for op in latest.values() if op[0] == "put"]
            deletes = [op[1:5] for op in latest.values() if op[0] == "del"]
            error: BaseException | None = None
            try:
                conn.execute("BEGIN")
                if puts:
                    conn.executemany("INSERT OR REPLACE INTO objects VALUES (?,?,?,?,?,?)", puts)
                if deletes:
                    conn.executemany("DELETE FROM objects WHERE grp=? AND resource=? AND namespace=? AND name=?", deletes)
                conn.execute("UPDATE meta SET value=? WHERE key='rv'", (str(top),))
                conn.execute("COMMIT")
            except BaseException as err:  # noqa: BLE001 - reported to every waiting request
                log.error("sqlite write failed: %s", describe(err))
                error = err
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            if self._loop is not None and not self._loop.is_closed():
                try:
                    self._loop.call_soon_threadsafe(self._mark_durable, top, error)
                except RuntimeError:
                    pass
