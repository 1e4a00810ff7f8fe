"""An idle consumer is quiet: a fetch that finds nothing is not a failure, whichever timeout
nats-py raises for it. (A batch fetch whose time ran out between its no-wait probe and its
waiting request raises a bare asyncio.TimeoutError, with no text: it was logged as
"fetch from <consumer> failed: " with nothing after it, 19 times in one multicluster bench, and
each cost a 0.5 s pause.) Against a real nats-server, with a short fetch timeout so that an idle
minute's worth of fetches takes a moment."""
from __future__ import annotations

import asyncio
import logging

import pytest
from nats.js.client import JetStreamContext

from trainyard.bus.consumer import Consumer, Delivery
from trainyard.bus.envelopes import ObjectEvent, decode
from trainyard.bus.publisher import Outgoing
from trainyard.bus.session import BusSession
from trainyard.bus.topology import EVENTS_STREAM, ConsumerSpec

pytestmark = pytest.mark.timeout(120)

FETCHES = 300


@pytest.fixture
async def bus(nats_server):
    session = await BusSession.open(nats_server.url, "test")
    yield session
    await session.close()


async def test_idle_fetches_are_not_failures(bus: BusSession, monkeypatch, caplog) -> None:
    fetched = {"calls": 0, "bare timeouts": 0}
    real_fetch = JetStreamContext.PullSubscription.fetch

    async def counted(self, *args, **kwargs):  # the real fetch, counted
        fetched["calls"] += 1
        try:
            return await real_fetch(self, *args, **kwargs)
        except asyncio.TimeoutError as err:
            if not str(err):
                fetched["bare timeouts"] += 1
            raise

    monkeypatch.setattr(JetStreamContext.PullSubscription, "fetch", counted)
    handled: list[str] = []

    async def handler(delivery: Delivery) -> None:
        handled.append(decode(ObjectEvent, delivery.data).name)

    spec = ConsumerSpec(EVENTS_STREAM, "idle-test", ["ty.events.>"], ack_wait_s=30, max_deliver=3)
    consumer = Consumer(bus.js, spec, handler, service="test", publisher=bus.publisher, fetch_timeout_s=0.001)
    stop = asyncio.Event()
    caplog.set_level(logging.WARNING, logger="trainyard.bus.consumer")
    task = asyncio.create_task(consumer.run(stop))
    try:
        # Until the case this guards against has happened at least once (it is a race inside
        # nats-py: a few in a hundred fetches here).
        while fetched["calls"] < FETCHES or not fetched["bare timeouts"]:
            await asyncio.sleep(0.05)
        assert [r.getMessage() for r in caplog.records if r.name == "trainyard.bus.consumer"] == []
        # ... and the consumer still takes what comes.
        event = ObjectEvent.from_object("c1", "ADDED", {
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "after-idle", "namespace": "ns", "uid": "u1", "resourceVersion": "1"}})
        await bus.publisher.publish_many([Outgoing(event.subject(), event, event.msg_id())])
        while handled != ["after-idle"]:
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
