"""list+watch with resourceVersion resume, bookmarks and relist on 410 Gone."""
from __future__ import annotations

import asyncio
import logging
from typing import Callable, Protocol

from trainyard.kube.client import KubeClient, KubeError
from trainyard.kube.resources import Resource

log = logging.getLogger(__name__)


class WatchHandler(Protocol):
    async def on_relist(self, resource: Resource, items: list[dict], resource_version: str) -> None:
        """A full list: the complete current state of the resource (after start or a 410)."""

    async def on_event(self, resource: Resource, event_type: str, obj: dict) -> None:
        """One ADDED / MODIFIED / DELETED watch event."""


class PagedWatchHandler(WatchHandler, Protocol):
    """A handler that takes a list page by page (``on_relist_page`` for each page, then
    ``on_relist_end``) instead of ``on_relist`` with every item: thousands of objects are then
    never all in memory at once."""

    async def on_relist_page(self, resource: Resource, items: list[dict], first: bool) -> None:
        """One page; ``first``: a new list starts (forget any earlier, unfinished one)."""

    async def on_relist_end(self, resource: Resource, resource_version: str) -> None:
        ...


async def list_and_watch(
    client: KubeClient,
    resource: Resource,
    handler: WatchHandler,
    stop: asyncio.Event,
    *,
    label_selector: str | None = None,
    watch_timeout_s: int = 300,
    on_synced: Callable[[bool], None] | None = None,
    not_found_retry_s: float = 10.0,
    max_retry_s: float = 10.0,
) -> None:
    """Keeps ``handler`` in step with ``resource`` until ``stop`` is set.

    A dropped stream resumes from the last seen resourceVersion (a bookmark advances it
    without an object); ``410 Gone`` (too old) lists again. A resource whose API is not
    installed (404 on list) is retried every ``not_found_retry_s``; other failures back off
    exponentially up to ``max_retry_s``.
    """
    resource_version: str | None = None
    failures = 0
    while not stop.is_set():
        try:
            if resource_version is None:
                resource_version = await _relist(client, resource, handler, label_selector)
                if on_synced:
                    on_synced(True)
            resource_version = await _follow(client, resource, handler, resource_version, stop,
                                             label_selector, watch_timeout_s)
            failures = 0
        except _Gone:
            log.info("watch expired (410); relisting", extra={"resource": resource.plural})
            resource_version = None
        except KubeError as err:
            failures += 1
            if on_synced and err.status == 0:
                on_synced(False)
            delay = not_found_retry_s if err.not_found else min(0.2 * 2 ** min(failures, 6), max_retry_s)
            log.log(logging.DEBUG if err.not_found else logging.WARNING,
                    "list/watch of %s failed: %s; retrying in %.1fs", resource.plural, err, delay)
            await _sleep_or_stop(stop, delay)
        except Exception:
            # Anything else (a malformed event, a handler bug) must not end the watch for good:
            # relist from scratch, which is always correct for a level-triggered consumer.
            failures += 1
            delay = min(0.2 * 2 ** min(failures, 6), max_retry_s)
            log.exception("list/watch of %s broke; relisting in %.1fs", resource.plural, delay)
            resource_version = None
            await _sleep_or_stop(stop, delay)


class _Gone(Exception):
    pass


async def _relist(client: KubeClient, resource: Resource, handler: WatchHandler,
                  label_selector: str | None) -> str:
    """Lists ``resource`` into ``handler``; returns the list's resourceVersion. A function of
    its own so that no page outlives it: a list left bound in the caller's frame would stay
    alive for as long as the watch that follows it (with thousands of objects, most of a
    restarted watcher's memory)."""
    if not hasattr(handler, "on_relist_page"):
        items, resource_version = await client.list(resource, label_selector=label_selector)
        await handler.on_relist(resource, items, resource_version)
        return resource_version
    listed_rv, first = "", True
    async for items, listed_rv in client.list_pages(resource, label_selector=label_selector):
        await handler.on_relist_page(resource, items, first)  # type: ignore[attr-defined]
        first = False
    await handler.on_relist_end(resource, listed_rv)  # type: ignore[attr-defined]
    return listed_rv


async def _follow(client: KubeClient, resource: Resource, handler: WatchHandler, rv: str,
                  stop: asyncio.Event, label_selector: str | None, timeout_s: int) -> str:
    stream = client.watch(resource, rv, timeout_s=timeout_s, label_selector=label_selector)
    stopper = asyncio.ensure_future(stop.wait())
    next_event: asyncio.Future | None = None
    try:
        iterator = stream.__aiter__()
        while True:
            next_event = asyncio.ensure_future(iterator.__anext__())
            done, _ = await asyncio.wait({next_event, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if next_event not in done:
                return rv
            try:
                event = next_event.result()
            except StopAsyncIteration:
                return rv
            event_type = event.get("type")
            obj = event.get("object") or {}
            if event_type == "ERROR":
                if obj.get("code") == 410:
                    raise _Gone()
                raise KubeError(int(obj.get("code") or 0), str(obj.get("reason", "")),
                                str(obj.get("message", "")))
            new_rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
            if event_type == "BOOKMARK":
                rv = new_rv
                continue
            obj.setdefault("apiVersion", resource.api_version)
            obj.setdefault("kind", resource.kind)
            await handler.on_event(resource, event_type, obj)
            rv = new_rv
    finally:
        stopper.cancel()
        if next_event is not None and not next_event.done():
            # The generator is still running inside this task: closing it before the
            # cancellation has finished raises "aclose(): asynchronous generator is already running".
            next_event.cancel()
            await asyncio.gather(next_event, return_exceptions=True)
        await stream.aclose()


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except asyncio.TimeoutError:
        pass


