"""In-memory caches fed by list+watch, and a keyed work queue (controller-runtime style).

A reconcile request carries only an object's key; each reconcile reads the caches. The work
queue never runs one key twice at once and coalesces repeated adds.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

from trainyard.kube.client import KubeClient, KubeError
from trainyard.kube.resources import Resource
from trainyard.kube.watch import list_and_watch

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects
Listener = Callable[[str, dict[str, Any]], None]

POD = Resource("", "v1", "pods", "Pod")
SERVICE = Resource("", "v1", "services", "Service")
NODE = Resource("", "v1", "nodes", "Node", False)
JOB = Resource("batch", "v1", "jobs", "Job")
ENDPOINT_SLICE = Resource("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice")
PVC = Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim")


def key_of(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


def _rv(obj: dict[str, Any]) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


_TOMBSTONES = 10_000


class Informer:
    """The current objects of one resource, kept by list+watch; listeners hear each change."""

    def __init__(self, client: KubeClient, resource: Resource) -> None:
        self.client = client
        self.resource = resource
        self.objects: dict[Key, dict[str, Any]] = {}
        self.listeners: list[Listener] = []
        self.synced = asyncio.Event()
        # resourceVersion at which each recently deleted key went away: a write-through of a
        # response that raced with the watch's DELETED must not bring the object back.
        self._deleted: dict[Key, int] = {}

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((namespace, name))

    def items(self, namespace: str | None = None) -> list[dict[str, Any]]:
        if namespace is None:
            return list(self.objects.values())
        return [obj for (ns, _), obj in self.objects.items() if ns == namespace]

    def store(self, obj: dict[str, Any]) -> None:
        """Write-through of an object the API just returned (never older than the cache)."""
        key = key_of(obj)
        meta = obj.get("metadata") or {}
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            return  # the API has removed it; the watch reports the deletion
        if key in self._deleted and _rv(obj) <= self._deleted[key]:
            return  # an answer older than the deletion the watch already reported
        current = self.objects.get(key)
        if current is None or _rv(obj) >= _rv(current):
            obj.setdefault("apiVersion", self.resource.api_version)
            obj.setdefault("kind", self.resource.kind)
            self.objects[key] = obj

    def _notify(self, event: str, obj: dict[str, Any]) -> None:
        for listener in self.listeners:
            try:
                listener(event, obj)
            except Exception:
                log.exception("listener of %s failed", self.resource.plural)

    async def on_relist(self, resource: Resource, items: list[dict], resource_version: str) -> None:
        fresh = {key_of(obj): obj for obj in items}
        gone = [obj for key, obj in self.objects.items() if key not in fresh]
        self.objects = fresh
        self._deleted = {key_of(obj): _rv(obj) for obj in gone}
        for obj in gone:
            self._notify("DELETED", obj)
        for obj in items:
            self._notify("ADDED", obj)
        self.synced.set()

    async def on_event(self, resource: Resource, event_type: str, obj: dict) -> None:
        key = key_of(obj)
        if event_type == "DELETED":
            self.objects.pop(key, None)
            self._deleted[key] = max(_rv(obj), self._deleted.get(key, 0))
            if len(self._deleted) > _TOMBSTONES:
                del self._deleted[next(iter(self._deleted))]
        else:
            current = self.objects.get(key)
            if current is not None and _rv(obj) < _rv(current):
                return  # a write-through already holds something newer
            self.objects[key] = obj
        self._notify(event_type, obj)

    async def run(self, stop: asyncio.Event) -> None:
        """List, then watch from the list's resourceVersion; relist on 410 or any breakage
        (the services' list+watch loop, with the data plane's shorter retries: a JobSet CRD
        installed after start must be picked up within seconds)."""
        await list_and_watch(self.client, self.resource, self, stop, watch_timeout_s=60,
                             not_found_retry_s=2.0, max_retry_s=3.0)


class WorkQueue:
    def __init__(self) -> None:
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._pending: set[Key] = set()
        self._active: set[Key] = set()
        self._dirty: set[Key] = set()
        self._timers: dict[Key, asyncio.TimerHandle] = {}

    def add(self, key: Key) -> None:
        if key in self._pending:
            return
        if key in self._active:
            self._dirty.add(key)
            return
        self._pending.add(key)
        self._queue.put_nowait(key)

    def add_after(self, key: Key, delay: float) -> None:
        timer = self._timers.get(key)
        loop = asyncio.get_running_loop()
        if timer is not None and timer.when() <= loop.time() + delay:
            return
        if timer is not None:
            timer.cancel()
        self._timers[key] = loop.call_later(delay, self._fire, key)

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> Key:
        key = await self._queue.get()
        self._pending.discard(key)
        self._active.add(key)
        return key

    def done(self, key: Key) -> None:
        self._active.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()


async def run_workers(name: str, queue: WorkQueue, reconcile: Callable[[Key], Awaitable[None]],
                      stop: asyncio.Event, workers: int = 4) -> None:
    """Process keys until ``stop``; errors requeue the key with a growing delay."""
    failures: dict[Key, int] = {}

    async def worker() -> None:
        while not stop.is_set():
            key = await queue.get()
            try:
                await reconcile(key)
                failures.pop(key, None)
            except KubeError as err:
                count = failures[key] = failures.get(key, 0) + 1
                level = logging.DEBUG if err.conflict or err.not_found else logging.WARNING
                log.log(level, "%s %s/%s: %s (retry %d)", name, key[0], key[1], err, count)
                queue.add_after(key, min(0.05 * 2 ** min(count, 8), 5.0))
            except Exception:
                count = failures[key] = failures.get(key, 0) + 1
                log.exception("%s %s/%s failed (retry %d)", name, key[0], key[1], count)
                queue.add_after(key, min(0.2 * 2 ** min(count, 5), 5.0))
            finally:
                queue.done(key)

    tasks = [asyncio.create_task(worker(), name=f"{name}-worker-{i}") for i in range(workers)]
    try:
        await stop.wait()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        queue.close()


def controller_owner(obj: dict[str, Any], kind: str) -> str | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == kind:
            return ref.get("name")
    return None
