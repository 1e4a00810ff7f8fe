"""A watcher's listing (after a restart or a 410) against a real nats-server: objects whose
current state is already the last event on their subject are not published again (a restart
costs the consumers nothing for thousands of unchanged objects, #16), an event that was
recorded but never published still is, and stored objects no longer listed get DELETED."""
from __future__ import annotations

import pytest

from trainyard.bus.envelopes import ObjectEvent
from trainyard.bus.session import BusSession
from trainyard.kube import resources as r
from trainyard_services.watcher.service import EventSink, ResourceFeed


def trainjob(name: str, rv: str, uid: str = "uid") -> dict:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": "ns", "uid": f"{uid}-{name}", "resourceVersion": rv}}


@pytest.fixture
async def bus(nats_server):
    session = await BusSession.open(nats_server.url, "test")
    yield session
    await session.close()


async def test_relist_publishes_only_what_the_stream_does_not_already_say(bus):
    sink = EventSink(bus, "c1")
    feed = ResourceFeed(bus, sink, "c1")
    # Observed before the restart: "same" recorded and published; "lost" recorded, its event
    # never published (the watcher died in between); "gone" recorded and published, since deleted.
    await sink._flush([(ObjectEvent.from_object("c1", "ADDED", trainjob("same", "5")), None),
                       (ObjectEvent.from_object("c1", "ADDED", trainjob("gone", "4")), None)])
    await bus.snapshots.record(ObjectEvent.from_object("c1", "ADDED", trainjob("lost", "3")).key, trainjob("lost", "3"))

    await feed.on_relist(r.TRAINJOB, [trainjob("same", "5"), trainjob("lost", "3"), trainjob("new", "7"),
                                      trainjob("changed", "9")], list_rv="10")
    queued = []
    while not sink._queue.empty():
        event, _ = sink._queue.get_nowait()
        queued.append((event.type, event.name, event.resource_version))
    assert sorted(queued) == [("ADDED", "changed", "9"), ("ADDED", "lost", "3"), ("ADDED", "new", "7"),
                              ("DELETED", "gone", "4")]

    # A newer state of an object already published is published again.
    await feed.on_relist(r.TRAINJOB, [trainjob("same", "6")], list_rv="11")
    event, _ = sink._queue.get_nowait()
    assert (event.type, event.name, event.resource_version) == ("ADDED", "same", "6")


async def test_a_list_handed_over_page_by_page_names_what_it_listed_across_pages(bus):
    """list_and_watch hands a list over in pages: an object on any page counts as listed, and a
    new list (``first``) forgets an earlier one that broke off midway."""
    sink = EventSink(bus, "c1")
    feed = ResourceFeed(bus, sink, "c1")
    await sink._flush([(ObjectEvent.from_object("c1", "ADDED", trainjob(name, "2")), None)
                       for name in ("a", "b", "c")])
    await feed.on_relist_page(r.TRAINJOB, [trainjob("a", "2")], True)
    await feed.on_relist_page(r.TRAINJOB, [trainjob("c", "2")], True)  # the first list broke off
    await feed.on_relist_page(r.TRAINJOB, [trainjob("b", "2")], False)
    await feed.on_relist_end(r.TRAINJOB, "10")
    queued = []
    while not sink._queue.empty():
        event, _ = sink._queue.get_nowait()
        queued.append((event.type, event.name))
    assert queued == [("DELETED", "a")]
