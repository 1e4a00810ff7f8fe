"""list_and_watch against a real devcluster: it follows changes and stops cleanly."""
from __future__ import annotations

import asyncio
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


async def test_watch_follows_changes_and_stops_while_waiting_for_an_event(devcluster, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="trainyard")
    client = await KubeClient.from_kubeconfig(str(devcluster.kubeconfig))
    recorder = Recorder()
    stop = asyncio.Event()
    task = asyncio.create_task(list_and_watch(client, CONFIGMAP, recorder, stop))
    try:
        await asyncio.wait_for(recorder.changed.wait(), 30)
        devcluster.kubectl("create", "configmap", "watched", "--from-literal=a=b")
        for _ in range(300):
            if ("ADDED", "watched") in recorder.names:
                break
            await asyncio.sleep(0.1)
        assert ("ADDED", "watched") in recorder.names
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
