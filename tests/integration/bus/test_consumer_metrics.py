"""A consumer's metrics against a real nats-server: the backlog comes from JetStream's consumer
info (not from what this process happened to fetch), work in progress is measured, retries are
counted, and every labelled series exists at zero before the first message."""
from __future__ import annotations

import asyncio

import pytest
from prometheus_client import REGISTRY

from trainyard.bus.consumer import Consumer, Delivery
from trainyard.bus.envelopes import ObjectEvent, decode
from trainyard.bus.publisher import Outgoing
from trainyard.bus.session import BusSession
from trainyard.bus.topology import EVENTS_STREAM, ConsumerSpec

pytestmark = pytest.mark.timeout(60)

DURABLE = "metrics-test"


def value(metric: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(metric, labels)


def backlog() -> tuple[float | None, float | None, float | None]:
    labels = {"stream": EVENTS_STREAM, "consumer": DURABLE}
    return (value("trainyard_jetstream_consumer_pending_messages", **labels),
            value("trainyard_jetstream_consumer_ack_pending_messages", **labels),
            value("workqueue_depth", name=DURABLE))


async def eventually(predicate, what: str, timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}; backlog (pending, ack pending, depth) = {backlog()}")
        await asyncio.sleep(0.05)


@pytest.fixture
async def bus(nats_server):
    session = await BusSession.open(nats_server.url, "test")
    yield session
    await session.close()


def event(name: str) -> ObjectEvent:
    return ObjectEvent.from_object("c1", "MODIFIED", {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": "1"}})


async def test_backlog_work_in_progress_and_retries_are_measured(bus: BusSession) -> None:
    gate = asyncio.Event()
    failed: set[str] = set()

    async def handler(delivery: Delivery) -> None:
        name = decode(ObjectEvent, delivery.data).name
        if name == "flaky" and name not in failed:
            failed.add(name)
            raise RuntimeError("transient")
        await gate.wait()

    spec = ConsumerSpec(EVENTS_STREAM, DURABLE, ["ty.events.>"], ack_wait_s=30, max_deliver=3)
    consumer = Consumer(bus.js, spec, handler, service="test", publisher=bus.publisher,
                        batch=2, concurrency=2, backlog_interval_s=0.1)
    # Created at zero before anything is consumed.
    assert value("controller_runtime_reconcile_total", controller=DURABLE, result="dead_letter") == 0
    assert value("workqueue_retries_total", name=DURABLE) == 0
    assert value("trainyard_dead_letter_messages_total", service="test", consumer=DURABLE) == 0
    assert value("trainyard_redelivered_messages_total", service="test", consumer=DURABLE) == 0

    events = [event(f"job-{i}") for i in range(10)] + [event("flaky")]
    await bus.publisher.publish_many(Outgoing(e.subject(), e, e.msg_id()) for e in events)
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        # Handlers are held: everything is still unacknowledged, most of it not even delivered.
        await eventually(lambda: backlog()[0] is not None and backlog()[1]
                         and backlog()[0] + backlog()[1] == len(events) and backlog()[0] > 0,
                         "the backlog of 11 messages, split into pending and ack pending")
        assert backlog()[2] == len(events)  # workqueue_depth is the real backlog
        await eventually(lambda: (value("workqueue_unfinished_work_seconds", name=DURABLE) or 0) > 0.2,
                         "unfinished work to grow while handlers are held")
        assert value("workqueue_longest_running_processor_seconds", name=DURABLE) > 0.1
        gate.set()
        await eventually(lambda: backlog() == (0, 0, 0), "the backlog to drain")
        assert value("workqueue_retries_total", name=DURABLE) == 1
        # The failed one came back once; the others were received once each.
        assert value("trainyard_redelivered_messages_total", service="test", consumer=DURABLE) == 1
        assert value("trainyard_received_messages_total", service="test", consumer=DURABLE) == len(events) + 1
        assert value("controller_runtime_reconcile_total", controller=DURABLE, result="error") == 1
        assert value("controller_runtime_reconcile_total", controller=DURABLE, result="success") == len(events)
        assert value("workqueue_work_duration_seconds_count", name=DURABLE) == len(events) + 1
        await eventually(lambda: value("workqueue_unfinished_work_seconds", name=DURABLE) == 0,
                         "no work in progress")
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
