"""list_and_watch against a real devcluster: it follows changes and stops cleanly."""
from __future__ import annotations

import asyncio
import gc
import logging

from trainyard.kube.client import KubeClient
from trainyard.kube.resources import CONFIGMAP
from trainyard.kube.watch import list_and_watch


class Recorder:
    def __init__(self) -> None:
        self.names: list[tuple[str, str]] = []
        self.changed = asyncio.Event()

    async def on_relist(self, resource, items, resource_version) -> None:
        self.names += [("LIST", item["metadata"]["name"]) for item in items]
        self.changed.set()

    async def on_event(self, resource, event_type, obj) -> None:
        self.names.append((event_type, obj["metadata"]["name"]))
        self.changed.set()


async def seen(recorder: Recorder, entry: tuple[str, str], timeout_s: float = 30.0) -> bool:
    """Whether ``entry`` reaches the recorder within ``timeout_s``."""
    for _ in range(int(timeout_s * 10)):
        if entry in recorder.names:
            return True
        await asyncio.sleep(0.1)
    return entry in recorder.names


async def test_watch_follows_changes_and_stops_while_waiting_for_an_event(devcluster, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="trainyard")
    client = await KubeClient.from_kubeconfig(str(devcluster.kubeconfig))
    recorder = Recorder()
    stop = asyncio.Event()
    task = asyncio.create_task(list_and_watch(client, CONFIGMAP, recorder, stop))
    try:
        await asyncio.wait_for(recorder.changed.wait(), 30)
        devcluster.kubectl("create", "configmap", "watched", "--from-literal=a=b")
        assert await seen(recorder, ("ADDED", "watched"))
        # Stop while the stream is idle, blocked on the next event: it must end cleanly
        # (no "asynchronous generator is already running"), and promptly.
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.wait_for(task, 10)
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    finally:
        stop.set()
        if not task.done():
            task.cancel()
        await client.close()


class PagedNames(Recorder):
    """A paged handler that keeps only names (list_and_watch prefers the pages when a handler
    takes them)."""

    async def on_relist_page(self, resource, items, first) -> None:
        self.names += [("LIST", item["metadata"]["name"]) for item in items]

    async def on_relist_end(self, resource, resource_version) -> None:
        self.changed.set()


def live_objects_named(prefix: str) -> list[str]:
    gc.collect()
    return [o["metadata"]["name"] for o in gc.get_objects()
            if isinstance(o, dict) and isinstance(o.get("metadata"), dict)
            and str(o["metadata"].get("name", "")).startswith(prefix) and "data" in o]


async def test_listed_objects_are_not_kept_while_the_watch_follows(devcluster) -> None:
    """A restarted watcher lists thousands of objects; once its handler has them, the list is
    let go: nothing of it stays alive while the watch that follows waits for events (a listed
    page kept by the loop was most of a restarted watcher's memory, #16)."""
    for i in range(3):
        devcluster.kubectl("create", "configmap", f"kept-{i}", "--from-literal=a=b")
    client = await KubeClient.from_kubeconfig(str(devcluster.kubeconfig))
    handler = PagedNames()
    stop = asyncio.Event()
    task = asyncio.create_task(list_and_watch(client, CONFIGMAP, handler, stop))
    try:
        await asyncio.wait_for(handler.changed.wait(), 30)
        assert {("LIST", f"kept-{i}") for i in range(3)} <= set(handler.names)
        devcluster.kubectl("create", "configmap", "later", "--from-literal=a=b")
        assert await seen(handler, ("ADDED", "later"))
        assert live_objects_named("kept-") == []
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await client.close()
