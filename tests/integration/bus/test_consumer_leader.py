"""A consumer on a 3-node JetStream cluster whose leader dies with its node, the client
connected to another node: the pull request it had open is served by the leader elected next,
not lost. That is what lets the request's idle heartbeat be a last resort at 30 s (a lost
request is noticed after two missed heartbeats and 5 s, 65 s; issue #33): the message published
after the kill must arrive well before that."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from fixtures.nats import NatsCluster
from trainyard.bus import consumer as consumer_module
from trainyard.bus.consumer import Consumer, Delivery
from trainyard.bus.envelopes import ObjectEvent, decode
from trainyard.bus.publisher import Outgoing
from trainyard.bus.session import BusSession
from trainyard.bus.topology import EVENTS_STREAM, REPLICAS_ENV, ConsumerSpec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

DURABLE = "leader-test"
# Well below the 65 s after which a lost request is noticed by its missing heartbeats, well
# above a JetStream election (6.4-7.0 s measured here).
AFTER_THE_KILL_S = 40.0


async def until(check, timeout: float, state) -> None:
    """Waits for the coroutine function ``check`` to say yes; on timeout says ``state()``."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {await state()}")
        await asyncio.sleep(0.05)


async def publish(bus: BusSession, name: str, timeout: float) -> None:
    """Publishes one TrainJob event, through an election of the stream's leader if need be."""
    event = ObjectEvent.from_object("c1", "ADDED", {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "resourceVersion": "1"}})
    deadline = time.monotonic() + timeout
    while True:
        try:
            await bus.publisher.publish_many([Outgoing(event.subject(), event, event.msg_id())])
            return
        except Exception:  # no stream leader for the moment
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_a_pull_open_on_a_consumer_leader_that_dies_is_served_by_the_next_leader(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REPLICAS_ENV, "3")
    monkeypatch.setattr(consumer_module, "PULL_HEARTBEAT_S", 30.0)
    cluster = NatsCluster(tmp_path / "cluster")
    cluster.start()
    stop = asyncio.Event()
    task = None
    bus = None
    try:
        bus = await BusSession.open(cluster.nodes[0].url, "test")  # connected to node-1 throughout
        handled: list[str] = []

        async def handler(delivery: Delivery) -> None:
            handled.append(decode(ObjectEvent, delivery.data).name)

        spec = ConsumerSpec(EVENTS_STREAM, DURABLE, ["ty.events.>"], ack_wait_s=30, max_deliver=3,
                            deliver_new_only=True)
        consumer = Consumer(bus.js, spec, handler, service="test", publisher=bus.publisher)
        task = asyncio.create_task(consumer.run(stop))

        async def leader() -> str:
            try:
                info = await bus.js.consumer_info(EVENTS_STREAM, DURABLE, timeout=2.0)
            except Exception:
                return ""
            return (info.cluster.leader if info.cluster else "") or ""

        async def asking() -> bool:  # a request open
            return consumer._credit > 0

        async def bound() -> bool:
            return consumer._bound is not None

        async def led_elsewhere() -> bool:
            return (await leader()) not in ("", "node-1")

        async def state() -> str:
            return f"leader {await leader()!r}, credit {consumer._credit}, handled {handled}"

        def handled_are(*names: str):
            async def check() -> bool:
                return handled == list(names)
            return check

        await until(bound, 60, state)
        # The consumer's leader on another node than the client's (a step-down elects another).
        if await leader() == "node-1":
            await bus.nc.request(f"$JS.API.CONSUMER.LEADER.STEPDOWN.{EVENTS_STREAM}.{DURABLE}", b"", timeout=5)
        await until(led_elsewhere, 30, state)
        victim = await leader()
        await until(asking, 30, state)
        await publish(bus, "before", 30)
        await until(handled_are("before"), 30, state)

        cluster.nodes[int(victim.rsplit("-", 1)[1]) - 1].kill()
        killed_at = time.monotonic()
        await publish(bus, "after", AFTER_THE_KILL_S)
        await until(handled_are("before", "after"), AFTER_THE_KILL_S - (time.monotonic() - killed_at), state)
        print(f"handled {time.monotonic() - killed_at:.1f} s after the kill of {victim}")
        assert await leader() not in ("", victim)
    finally:
        stop.set()
        if task is not None:
            await asyncio.wait_for(task, 30)
        if bus is not None:
            await bus.close()
        cluster.stop()

