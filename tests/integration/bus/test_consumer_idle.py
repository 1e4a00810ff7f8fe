"""An idle consumer is quiet: one long pull request at a time, asked again only when the server
says it expired (a fetch a second cost two requests and two status replies a second, per
consumer: 16 partitions x each role's streams). And a consumer deleted under a running one is
re-created, and what comes next is handled. Against a real nats-server, with a short request
expiry so that several expiries take a moment."""
from __future__ import annotations

import asyncio
import logging

import pytest
from nats.js.errors import NotFoundError

from trainyard.bus import consumer as consumer_module
from trainyard.bus.consumer import Consumer, Delivery
from trainyard.bus.envelopes import ObjectEvent, decode
from trainyard.bus.publisher import Outgoing
from trainyard.bus.session import BusSession
from trainyard.bus.topology import EVENTS_STREAM, ConsumerSpec

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def bus(nats_server):
    session = await BusSession.open(nats_server.url, "test")
    yield session
    await session.close()


async def publish(bus: BusSession, name: str) -> None:
    event = ObjectEvent.from_object("c1", "ADDED", {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "resourceVersion": "1"}})
    await bus.publisher.publish_many([Outgoing(event.subject(), event, event.msg_id())])


async def until(predicate, timeout: float = 30.0, state=None) -> None:
    """Waits for ``predicate()``; on timeout says ``state()`` (what the test was waiting on)."""
    async def loop() -> None:
        while not predicate():
            await asyncio.sleep(0.02)
    try:
        await asyncio.wait_for(loop(), timeout)
    except asyncio.TimeoutError:
        raise AssertionError(f"not within {timeout} s: {state() if state else predicate}") from None


async def test_an_idle_consumer_asks_again_only_when_its_request_expired(bus: BusSession, nats_server, monkeypatch,
                                                                         caplog) -> None:
    monkeypatch.setattr(consumer_module, "PULL_EXPIRES_S", 0.5)
    handled: list[str] = []

    async def handler(delivery: Delivery) -> None:
        handled.append(decode(ObjectEvent, delivery.data).name)

    spec = ConsumerSpec(EVENTS_STREAM, "idle-test", ["ty.events.>"], ack_wait_s=30, max_deliver=3)
    consumer = Consumer(bus.js, spec, handler, service="test", publisher=bus.publisher)
    # What goes over the wire, seen from another connection: the pull requests, and the
    # statuses the server sends to the consumer's inbox.
    observer = await BusSession.open(nats_server.url, "observer")
    seen: list[str] = []

    async def on_request(msg) -> None:
        seen.append("request")

    async def on_status(msg) -> None:
        if msg.headers and msg.headers.get("Status"):
            seen.append(msg.headers["Status"])

    await observer.nc.subscribe(f"$JS.API.CONSUMER.MSG.NEXT.{EVENTS_STREAM}.idle-test", cb=on_request)
    await observer.nc.flush()
    stop = asyncio.Event()
    caplog.set_level(logging.WARNING, logger="trainyard.bus.consumer")
    task = asyncio.create_task(consumer.run(stop))
    try:
        await until(lambda: bool(consumer._inbox))
        await observer.nc.subscribe(consumer._inbox, cb=on_status)
        await observer.nc.flush()
        await until(lambda: seen.count("request") >= 4)
        requests = [i for i, what in enumerate(seen) if what == "request"]
        # Between two requests, the first one's idle heartbeats (100) and its expiry (408).
        for a, b in zip(requests[1:], requests[2:]):
            assert [what for what in seen[a + 1:b] if what != "100"] == ["408"], seen
        assert [r.getMessage() for r in caplog.records if r.name == "trainyard.bus.consumer"] == []
        # ... and the consumer still takes what comes.
        await publish(bus, "after-idle")
        await until(lambda: handled == ["after-idle"])
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        await observer.close()


async def test_a_consumer_deleted_under_a_running_one_is_created_again(bus: BusSession) -> None:
    handled: list[str] = []

    async def handler(delivery: Delivery) -> None:
        handled.append(decode(ObjectEvent, delivery.data).name)

    spec = ConsumerSpec(EVENTS_STREAM, "deleted-test", ["ty.events.>"], ack_wait_s=30, max_deliver=3,
                        deliver_new_only=True)
    consumer = Consumer(bus.js, spec, handler, service="test", publisher=bus.publisher)
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        await until(lambda: bool(consumer._inbox))  # the durable exists (it delivers new messages only)
        await publish(bus, "before")
        await until(lambda: handled == ["before"])
        # The server tells the waiting request (409 Consumer Deleted); the consumer re-creates
        # the durable and asks again.
        await bus.js.delete_consumer(EVENTS_STREAM, "deleted-test")
        while True:
            try:
                await bus.js.consumer_info(EVENTS_STREAM, "deleted-test")
                break
            except NotFoundError:
                await asyncio.sleep(0.05)
        await publish(bus, "after")
        await until(lambda: handled == ["before", "after"])
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def test_an_idle_consumer_reads_its_backlog_only_when_something_may_wait(bus: BusSession, nats_server) -> None:
    """The backlog gauges came from a consumer-info request every interval, idle or not: most
    of an idle replica's bus traffic at 16 partitions. With a pull request open and nothing
    delivered, nothing can be pending: the consumer asks again only after a delivery."""
    handled: list[str] = []

    async def handler(delivery: Delivery) -> None:
        handled.append(decode(ObjectEvent, delivery.data).name)

    spec = ConsumerSpec(EVENTS_STREAM, "backlog-idle", ["ty.events.>"], ack_wait_s=30, max_deliver=3)
    consumer = Consumer(bus.js, spec, handler, service="test", publisher=bus.publisher, backlog_interval_s=0.1)
    observer = await BusSession.open(nats_server.url, "observer")
    infos: list[int] = []

    async def on_info(msg) -> None:
        infos.append(1)

    await observer.nc.subscribe(f"$JS.API.CONSUMER.INFO.{EVENTS_STREAM}.backlog-idle", cb=on_info)
    await observer.nc.flush()
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        # Bound (the bind's consumer info is the first backlog reading) and its request open.
        await until(lambda: consumer._bound is not None and consumer._credit > 0,
                    state=lambda: f"bound: {consumer._bound is not None}, credit: {consumer._credit}, "
                                  f"consumer-info requests seen: {len(infos)}")
        seen = len(infos)
        await asyncio.sleep(1.5)  # 15 intervals idle
        assert len(infos) == seen, infos
        await publish(bus, "wakes-it")
        await until(lambda: handled == ["wakes-it"])
        await until(lambda: len(infos) >= seen + 1)  # something arrived: the backlog is read again...
        await asyncio.sleep(1.0)
        assert len(infos) <= seen + 2, infos  # ...and once it is seen empty, not again while idle
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        await observer.close()


async def test_an_idle_consumers_backlog_watch_sleeps_until_a_delivery(bus: BusSession, nats_server) -> None:
    """Idle, the backlog watch neither asks nor wakes: a replica holds a consumer per partition
    and stream, and each watch woke every interval to find it had nothing to do. A delivery
    wakes it at once, and the backlog is read again."""
    handled: list[str] = []

    async def handler(delivery: Delivery) -> None:
        handled.append(decode(ObjectEvent, delivery.data).name)

    spec = ConsumerSpec(EVENTS_STREAM, "backlog-sleeps", ["ty.events.>"], ack_wait_s=30, max_deliver=3)
    consumer = Consumer(bus.js, spec, handler, service="test", publisher=bus.publisher, backlog_interval_s=0.05)
    looks: list[bool] = []
    known_idle = consumer._known_idle

    def counted(*args) -> bool:
        looks.append(known_idle(*args))
        return looks[-1]

    consumer._known_idle = counted  # type: ignore[method-assign]
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        await until(lambda: looks and looks[-1], state=lambda: f"looks: {looks}")  # idle, and known to be
        seen = len(looks)
        await asyncio.sleep(1.0)  # 20 intervals
        assert len(looks) == seen, f"the idle watch woke {len(looks) - seen} times in 1 s"
        await publish(bus, "wakes-it")
        await until(lambda: handled == ["wakes-it"] and len(looks) > seen)
        await until(lambda: looks[-1], state=lambda: f"looks since the delivery: {looks[seen:]}")
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
