"""Bus contract tests against a real nats-server (tests/fixtures/nats.py)."""
from __future__ import annotations

import asyncio
import base64
import json
import time

import pytest
from opentelemetry.sdk.trace import TracerProvider

from trainyard.bus.consumer import Consumer, Delivery, PermanentError
from trainyard.bus.envelopes import DeadLetter, ObjectEvent, decode
from trainyard.bus.kv import AppliedPlan, CasConflict
from trainyard.bus.publisher import Outgoing
from trainyard.bus.session import BusSession
from trainyard.bus.subjects import ObjectKey, kv_key
from trainyard.bus.topology import DEAD_LETTER_STREAM, EVENTS_STREAM, ConsumerSpec

pytestmark = pytest.mark.timeout(60)


def trainjob(name: str, rv: str = "1", uid: str = "uid-1") -> dict:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": name, "namespace": "team.a", "uid": uid, "resourceVersion": rv},
    }


def event(name: str, rv: str = "1") -> ObjectEvent:
    return ObjectEvent.from_object("c1", "MODIFIED", trainjob(name, rv))


async def publish_events(bus: BusSession, events: list[ObjectEvent]) -> None:
    await bus.publisher.publish_many(
        Outgoing(e.subject(), e, e.msg_id()) for e in events
    )


class Recorder:
    """A handler that records what it saw and can be told to fail."""

    def __init__(self, fail_times: int = 0, permanent: bool = False) -> None:
        self.seen: list[tuple[str, int]] = []
        self.fail_times = fail_times
        self.permanent = permanent
        self.headers: list[dict] = []
        self.changed = asyncio.Event()

    async def __call__(self, delivery: Delivery) -> None:
        ev = decode(ObjectEvent, delivery.data)
        self.seen.append((ev.name, int(ev.resource_version)))
        self.headers.append(delivery.headers)
        self.changed.set()
        if ev.name.startswith("poison"):
            if self.permanent:
                raise PermanentError(f"cannot handle {ev.name}")
            raise RuntimeError(f"boom on {ev.name}")
        if self.fail_times > 0:
            self.fail_times -= 1
            raise RuntimeError("transient")

    async def wait_for(self, predicate, timeout: float = 20.0) -> None:
        async def loop():
            while not predicate(self.seen):
                self.changed.clear()
                await self.changed.wait()
        await asyncio.wait_for(loop(), timeout)


@pytest.fixture
async def bus(nats_server):
    session = await BusSession.open(nats_server.url, "test")
    yield session
    await session.close()


async def run_consumer(bus: BusSession, handler, durable="t", max_deliver=3, spec: ConsumerSpec | None = None, **kw):
    spec = spec or ConsumerSpec(EVENTS_STREAM, durable, ["ty.events.>"], ack_wait_s=5, max_deliver=max_deliver)
    consumer = Consumer(bus.js, spec, handler, service="test", publisher=bus.publisher, **kw)
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    return stop, task


async def stop_consumer(stop, task):
    stop.set()
    await asyncio.wait_for(task, 15)


def plan(name: str, partition: int) -> Outgoing:
    """A message on the plans stream (a work queue) of cluster c1, with an event as its body."""
    from trainyard.bus.subjects import plan_subject

    return Outgoing(plan_subject("c1", "ns", name, partition), event(name), f"plan-{name}")


async def publish_once_reconnected(publish) -> None:
    """Calls ``publish()`` until the client is back after a restart of nats-server (10 s at
    most; the last try raises what kept failing)."""
    for _ in range(50):
        try:
            return await publish()
        except Exception:
            await asyncio.sleep(0.2)
    await publish()


async def test_topology_is_idempotent_across_replicas(nats_server, bus):
    second = await BusSession.open(nats_server.url, "test-2")
    try:
        info = await second.js.stream_info(EVENTS_STREAM)
        assert info.config.duplicate_window >= 120
    finally:
        await second.close()


async def test_same_msg_id_is_stored_once(bus):
    ev = event("job.one")
    acks = await bus.publisher.publish_many(
        [Outgoing(ev.subject(), ev, ev.msg_id())] * 2
    )
    assert [a.duplicate for a in acks] == [None, True] or [bool(a.duplicate) for a in acks] == [False, True]
    info = await bus.js.stream_info(EVENTS_STREAM)
    assert info.state.messages == 1


async def test_failed_message_is_redelivered_then_acked(bus):
    recorder = Recorder(fail_times=1)
    stop, task = await run_consumer(bus, recorder)
    await publish_events(bus, [event("j1")])
    await recorder.wait_for(lambda seen: len(seen) >= 2)
    await stop_consumer(stop, task)
    assert recorder.seen == [("j1", 1), ("j1", 1)]
    info = await bus.js.consumer_info(EVENTS_STREAM, "t")
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def read_dead_letters(bus: BusSession) -> list[DeadLetter]:
    sub = await bus.js.pull_subscribe("ty.dead.>", stream=DEAD_LETTER_STREAM)
    try:
        msgs = await sub.fetch(10, timeout=2)
    except Exception:
        return []
    finally:
        # A fetch that timed out leaves its request's late status in the subscription's queue,
        # and the session's drain at close waits on every queue (30 s, nats-py's drain timeout).
        await sub.unsubscribe()
    return [decode(DeadLetter, m.data) for m in msgs]


async def test_poison_message_goes_to_dead_letter_and_consuming_goes_on(bus):
    recorder = Recorder()
    stop, task = await run_consumer(bus, recorder, max_deliver=2)
    await publish_events(bus, [event("poison-1"), event("after-1")])
    await recorder.wait_for(lambda seen: seen.count(("poison-1", 1)) == 2 and ("after-1", 1) in seen)
    letters = []
    for _ in range(50):
        letters = await read_dead_letters(bus)
        if letters:
            break
        await asyncio.sleep(0.1)
    await publish_events(bus, [event("after-2")])
    await recorder.wait_for(lambda seen: ("after-2", 1) in seen)
    await stop_consumer(stop, task)
    assert len(letters) == 1
    letter = letters[0]
    assert letter.error == "RuntimeError: boom on poison-1"
    assert letter.deliveries == 2
    assert json.loads(base64.b64decode(letter.data))["name"] == "poison-1"


async def test_permanent_error_is_dead_lettered_at_once(bus):
    recorder = Recorder(permanent=True)
    stop, task = await run_consumer(bus, recorder, max_deliver=5)
    await publish_events(bus, [event("poison-x")])
    letters = []
    for _ in range(100):
        letters = await read_dead_letters(bus)
        if letters:
            break
        await asyncio.sleep(0.1)
    await stop_consumer(stop, task)
    assert recorder.seen == [("poison-x", 1)]
    assert [letter.error for letter in letters] == ["cannot handle poison-x"]


async def test_one_object_in_order_many_objects_in_parallel(bus):
    running: set[str] = set()
    overlap: list[int] = []
    order: dict[str, list[int]] = {}

    async def handler(delivery: Delivery) -> None:
        ev = decode(ObjectEvent, delivery.data)
        assert ev.name not in running, "two messages of one object handled at once"
        running.add(ev.name)
        overlap.append(len(running))
        await asyncio.sleep(0.01)
        order.setdefault(ev.name, []).append(int(ev.resource_version))
        running.discard(ev.name)

    stop, task = await run_consumer(bus, handler, concurrency=8)
    await publish_events(bus, [event(f"job-{j}", str(rv)) for rv in range(1, 6) for j in range(8)])
    for _ in range(200):
        if sum(len(v) for v in order.values()) == 40:
            break
        await asyncio.sleep(0.05)
    await stop_consumer(stop, task)
    assert order == {f"job-{j}": [1, 2, 3, 4, 5] for j in range(8)}
    assert max(overlap) > 1


async def test_trace_context_travels_in_headers(bus):
    provider = TracerProvider()
    tracer = provider.get_tracer("test")
    recorder = Recorder()
    stop, task = await run_consumer(bus, recorder)
    with tracer.start_as_current_span("producer") as span:
        trace_id = format(span.get_span_context().trace_id, "032x")
        await publish_events(bus, [event("traced")])
    await recorder.wait_for(lambda seen: len(seen) == 1)
    await stop_consumer(stop, task)
    traceparent = recorder.headers[0].get("traceparent", "")
    assert traceparent.split("-")[1] == trace_id


async def test_snapshot_never_rolls_back_and_tombstones_stay(bus):
    key = ObjectKey("c1", "TrainJob", "team.a", "x.y")
    assert await bus.snapshots.record(key, trainjob("x.y", "5"))
    assert not await bus.snapshots.record(key, trainjob("x.y", "4"))
    assert (await bus.snapshots.get(key))["metadata"]["resourceVersion"] == "5"
    assert await bus.snapshots.record(key, trainjob("x.y", "6"), deleted=True)
    assert await bus.snapshots.get(key) is None
    assert not await bus.snapshots.record(key, trainjob("x.y", "7"))
    assert await bus.snapshots.record(key, trainjob("x.y", "8", uid="uid-2"))
    assert [o["metadata"]["uid"] for o in await bus.snapshots.list("c1", "TrainJob")] == ["uid-2"]
    assert await bus.snapshots.list("c1", "JobSet") == []


async def test_a_lagging_replica_with_a_remembered_revision_does_not_roll_back(nats_server, bus):
    """Each watcher remembers the revision it wrote and updates without reading first: a write
    by another replica in between makes that compare-and-set fail, and the newer snapshot stays."""
    other = await BusSession.open(nats_server.url, "test-2")
    try:
        key = ObjectKey("c1", "JobSet", "ns", "lag")
        assert await bus.snapshots.record(key, trainjob("lag", "5"))
        assert await other.snapshots.record(key, trainjob("lag", "7"))
        assert not await bus.snapshots.record(key, trainjob("lag", "6"))
        assert (await bus.snapshots.get(key))["metadata"]["resourceVersion"] == "7"
        assert await bus.snapshots.record(key, trainjob("lag", "8"))
        assert not await other.snapshots.record(key, trainjob("lag", "7"))
        assert (await other.snapshots.get(key))["metadata"]["resourceVersion"] == "8"
    finally:
        await other.close()


async def test_batched_snapshot_read_matches_key_by_key_reads(nats_server, bus):
    """The planner reads a runtime and nine possible children at once: the batched direct get
    must answer exactly what single gets answer — live objects, None for absent keys, for
    tombstones and for purged entries — in the order asked, with no reply mixed into another
    read running at the same time."""
    live = [ObjectKey("c1", "TrainJob", "team.a", f"live-{i}") for i in range(3)]
    for i, key in enumerate(live):
        assert await bus.snapshots.record(key, trainjob(key.name, str(i + 1)))
    tomb = ObjectKey("c1", "TrainJob", "team.a", "tomb")
    assert await bus.snapshots.record(tomb, trainjob("tomb", "1"))
    assert await bus.snapshots.record(tomb, trainjob("tomb", "2"), deleted=True)
    purged = ObjectKey("c1", "TrainJob", "team.a", "purged")
    assert await bus.snapshots.record(purged, trainjob("purged", "1"))
    await bus.snapshots._kv.purge(kv_key(purged))
    absent = ObjectKey("c1", "JobSet", "team.a", "never")
    keys = [live[2], absent, tomb, live[0], purged, live[1]]

    assert bus.snapshots._kv._direct, "a single-copy bucket allows direct gets"
    batched = await bus.snapshots.get_many(keys)
    one_by_one = [await bus.snapshots.get(key) for key in keys]
    assert batched == one_by_one
    assert [o and o["metadata"]["name"] for o in batched] == ["live-2", None, None, "live-0", None, "live-1"]
    assert await bus.snapshots.get_many([absent, tomb]) == [None, None]  # nothing found: 404 ends it

    # Many reads at once share one reply subscription; each gets its own answers.
    answers = await asyncio.gather(*(bus.snapshots.get_many([live[i % 3], absent]) for i in range(30)))
    assert [a[0]["metadata"]["name"] for a in answers] == [f"live-{i % 3}" for i in range(30)]

    # A bucket without direct gets (an earlier release's, until the topology switches it)
    # answers the same, key by key on the stream leader.
    bus.snapshots._kv._direct = False
    try:
        assert await bus.snapshots.get_many(keys) == one_by_one
    finally:
        bus.snapshots._kv._direct = True


async def test_a_known_copy_stands_for_the_snapshot_only_when_it_is_that_version(bus):
    """Status hands the JobSet its event carried: returned as is when the snapshot is that
    resourceVersion, else the snapshot answers (newer, older or deleted)."""
    key = ObjectKey("c1", "JobSet", "team.a", "js")
    assert await bus.snapshots.record(key, trainjob("js", "5"))
    copy = trainjob("js", "5")
    assert await bus.snapshots.get(key, known=copy) is copy
    older = trainjob("js", "4")
    got = await bus.snapshots.get(key, known=older)
    assert got is not older and got["metadata"]["resourceVersion"] == "5"
    assert await bus.snapshots.record(key, trainjob("js", "6"), deleted=True)
    assert await bus.snapshots.get(key, known=trainjob("js", "6")) is None


async def test_writes_keep_keyvalue_create_and_update_semantics(bus):
    """Writes go through one reply subscription, with nats-py's meanings: a create fails on a
    live key and lands on a deleted or purged one; an update needs the current revision."""
    from nats.js.errors import KeyWrongLastSequenceError

    from trainyard.bus.kv import _put

    kv = bus.applied._kv
    first = await _put(kv, "c1.ns.w", b"one", None, None)
    with pytest.raises(KeyWrongLastSequenceError):
        await _put(kv, "c1.ns.w", b"again", None, None)
    second = await _put(kv, "c1.ns.w", b"two", first, None)
    with pytest.raises(KeyWrongLastSequenceError):
        await _put(kv, "c1.ns.w", b"stale", first, None)
    assert (await kv.get("c1.ns.w")).value == b"two" and second > first
    await kv.delete("c1.ns.w")
    assert await _put(kv, "c1.ns.w", b"after delete", None, None) > second
    await kv.purge("c1.ns.w")
    await _put(kv, "c1.ns.w", b"after purge", None, None)
    assert (await kv.get("c1.ns.w")).value == b"after purge"
    with pytest.raises(CasConflict):
        await bus.applied.compare_and_set("c1.ns.w", AppliedPlan(uid="u", generation=1, planHash="h"), None)


async def test_an_existing_bucket_is_switched_to_direct_gets(nats_server, bus):
    """A bucket made by an earlier release (no direct gets) is switched when the topology is
    ensured again, and keeps its entries."""
    key = ObjectKey("c1", "TrainJob", "team.a", "kept")
    assert await bus.snapshots.record(key, trainjob("kept", "3"))
    stream = (await bus.js.stream_info("KV_ty_objects")).config
    stream.allow_direct = False
    await bus.js.update_stream(stream)
    again = await BusSession.open(nats_server.url, "test-2")
    try:
        assert (await again.js.stream_info("KV_ty_objects")).config.allow_direct is True
        assert again.snapshots._kv._direct
        assert (await again.snapshots.get_many([key, key]))[0]["metadata"]["resourceVersion"] == "3"
    finally:
        await again.close()


async def test_tombstones_and_removed_entries_expire(bus):
    """A deleted object's tombstone and a forgotten TrainJob's applied entry leave nothing in
    their buckets once their TTL passed (here 1 s instead of 10 minutes): the buckets do not
    grow with history."""
    from nats.js.errors import NotFoundError

    from trainyard.bus.kv import kv_key

    bus.snapshots.tombstone_ttl_s = 1.0
    bus.applied.tombstone_ttl_s = 1.0
    key = ObjectKey("c1", "TrainJob", "ns", "gone")
    assert await bus.snapshots.record(key, trainjob("gone", "5"))
    assert await bus.snapshots.record(key, trainjob("gone", "6"), deleted=True)
    assert not await bus.snapshots.record(key, trainjob("gone", "5"))  # no resurrection meanwhile
    await bus.applied.compare_and_set("c1.ns.gone", AppliedPlan(uid="u", generation=1, planHash="h"), None)
    await bus.applied.delete("c1.ns.gone")
    assert (await bus.applied.read("c1.ns.gone")).value is None

    async def held(stream: str, subject: str) -> bool:
        try:
            await bus.js.get_last_msg(stream, subject)
            return True
        except NotFoundError:
            return False

    for _ in range(100):
        if not await held("KV_ty_objects", f"$KV.ty_objects.{kv_key(key)}") \
                and not await held("KV_ty_applied", "$KV.ty_applied.c1.ns.gone"):
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the tombstone or the removal marker is still stored")
    assert await bus.snapshots.record(key, trainjob("gone", "9", uid="uid-2"))


async def test_applied_plan_compare_and_set(bus):
    plan = AppliedPlan(uid="u", generation=1, planHash="h1")
    revision = await bus.applied.compare_and_set("k", plan, None)
    with pytest.raises(CasConflict):
        await bus.applied.compare_and_set("k", plan, None)
    newer = AppliedPlan(uid="u", generation=2, planHash="h2")
    await bus.applied.compare_and_set("k", newer, revision)
    with pytest.raises(CasConflict):
        await bus.applied.compare_and_set("k", plan, revision)
    assert (await bus.applied.read("k")).value.generation == 2


async def add_file_held(bus: BusSession, spec: ConsumerSpec) -> None:
    """``spec``'s durable as an earlier release made it: its state kept in a file."""
    from dataclasses import replace

    await bus.js.add_consumer(spec.stream, config=replace(spec.config(), mem_storage=None))


async def read_after_the_upgrade(bus: BusSession, spec: ConsumerSpec) -> list[tuple[str, int]]:
    """Runs ``spec``'s consumer until it has handled the event named "waiting"; checks that it
    now keeps its state in memory and returns what it handled."""
    recorder = Recorder()
    stop, task = await run_consumer(bus, recorder, spec=spec)
    await recorder.wait_for(lambda seen: ("waiting", 1) in seen)
    await stop_consumer(stop, task)
    assert (await bus.js.consumer_info(spec.stream, spec.durable)).config.mem_storage is True
    return recorder.seen


async def test_consumer_resumes_after_the_server_restarts(nats_server, bus):
    recorder = Recorder()
    stop, task = await run_consumer(bus, recorder)
    await publish_events(bus, [event("before")])
    await recorder.wait_for(lambda seen: ("before", 1) in seen)
    await asyncio.to_thread(nats_server.restart)
    for _ in range(100):
        if bus.nc.is_connected:
            break
        await asyncio.sleep(0.1)
    await publish_once_reconnected(lambda: publish_events(bus, [event("after")]))
    await recorder.wait_for(lambda seen: ("after", 1) in seen, timeout=30)
    await stop_consumer(stop, task)
    assert recorder.seen.count(("before", 1)) == 1


async def test_a_consumer_without_a_timer_of_its_own_resumes_when_its_replica_checks_it(nats_server, bus):
    """A replica's consumers keep no liveness timer each (16 partitions x streams of them woke an
    idle replica every few seconds): the replica's tick calls check_alive() for all of them,
    and that alone brings a consumer back after nats-server restarted under it."""
    recorder = Recorder()
    spec = ConsumerSpec(EVENTS_STREAM, "held", ["ty.events.>"], ack_wait_s=5, max_deliver=3)
    consumer = Consumer(bus.js, spec, recorder, service="test", publisher=bus.publisher, liveness_check_s=None)
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    await publish_events(bus, [event("before")])
    await recorder.wait_for(lambda seen: ("before", 1) in seen)
    await asyncio.to_thread(nats_server.restart)
    await publish_once_reconnected(lambda: publish_events(bus, [event("after")]))
    await asyncio.sleep(3)
    assert ("after", 1) not in recorder.seen  # its request died with the server; nothing woke it

    async def replica_tick() -> None:
        while True:
            consumer.check_alive(time.monotonic())
            await asyncio.sleep(1.0)

    ticker = asyncio.create_task(replica_tick())
    try:
        await recorder.wait_for(lambda seen: ("after", 1) in seen, timeout=10)
    finally:
        ticker.cancel()
        await stop_consumer(stop, task)


async def test_a_work_queue_consumer_keeps_its_state_in_memory_and_loses_nothing_to_a_restart(nats_server, bus):
    """The plans stream removes what was acknowledged, so its consumers hold their state in
    memory (no state file written ten times a second per busy partition). A restart of
    nats-server loses that consumer; its reader creates it again and gets exactly what was not
    acknowledged: each plan handled once, none lost."""
    from trainyard.bus.topology import PLANS_STREAM

    recorder = Recorder()
    spec = ConsumerSpec(PLANS_STREAM, "applier-p0_c1", ["ty.desired.c1.p0.>"], ack_wait_s=5)
    stop, task = await run_consumer(bus, recorder, spec=spec)
    await bus.publisher.publish_many([plan("before", 0)])
    await recorder.wait_for(lambda seen: ("before", 1) in seen)
    assert (await bus.js.consumer_info(PLANS_STREAM, spec.durable)).config.mem_storage is True

    await asyncio.to_thread(nats_server.restart)
    await publish_once_reconnected(lambda: bus.publisher.publish_many([plan("after", 0)]))
    await recorder.wait_for(lambda seen: ("after", 1) in seen, timeout=30)
    await stop_consumer(stop, task)
    assert sorted(recorder.seen) == [("after", 1), ("before", 1)]
    assert (await bus.js.stream_info(PLANS_STREAM)).state.messages == 0


async def test_an_earlier_releases_file_held_plans_consumer_moves_to_memory_with_its_backlog(bus):
    """Upgrading from a release whose plans consumers kept their state in files: the server
    cannot change the storage in place, so the consumer is created again in memory and still
    delivers what waited in the stream (nothing acknowledged is kept there)."""
    from trainyard.bus.topology import PLANS_STREAM

    spec = ConsumerSpec(PLANS_STREAM, "applier-p1_c1", ["ty.desired.c1.p1.>"], ack_wait_s=5)
    await add_file_held(bus, spec)
    await bus.publisher.publish_many([plan("waiting", 1)])

    assert await read_after_the_upgrade(bus, spec) == [("waiting", 1)]


async def test_an_events_consumer_held_in_memory_resumes_where_its_reader_was_after_a_restart(nats_server, bus):
    """The events stream keeps what was read, so a consumer created again after nats-server
    forgot it must start where its reader was: what was acknowledged is not handled again, what
    was delivered but not finished and what came while it was gone are handled."""
    release = asyncio.Event()
    recorder = Recorder()

    async def handler(delivery: Delivery) -> None:
        await recorder(delivery)
        if decode(ObjectEvent, delivery.data).name.startswith("slow") and not release.is_set():
            await release.wait()  # in hand when the server goes away: never acknowledged

    spec = ConsumerSpec(EVENTS_STREAM, "status-p0_c1", ["ty.events.>"], ack_wait_s=30, max_deliver=3)
    stop, task = await run_consumer(bus, handler, spec=spec)
    await publish_events(bus, [event(f"done-{i}") for i in range(5)])
    await recorder.wait_for(lambda seen: len(seen) == 5)
    await publish_events(bus, [event("slow")])
    await recorder.wait_for(lambda seen: ("slow", 1) in seen)
    assert (await bus.js.consumer_info(EVENTS_STREAM, spec.durable)).config.mem_storage is True

    await asyncio.to_thread(nats_server.restart)
    await publish_once_reconnected(lambda: publish_events(bus, [event("after")]))
    await recorder.wait_for(lambda seen: ("after", 1) in seen, timeout=30)  # created again by now
    release.set()
    await recorder.wait_for(lambda seen: seen.count(("slow", 1)) == 2)
    await stop_consumer(stop, task)
    assert all(recorder.seen.count((f"done-{i}", 1)) == 1 for i in range(5)), recorder.seen


async def test_a_consumer_bound_behind_another_readers_unacknowledged_messages_skips_none_after_a_restart(
        nats_server, bus):
    """A partition taken over from a replica that died holding messages: those are still
    unacknowledged on the server, so a restart before they come back must not resume past them."""
    spec = ConsumerSpec(EVENTS_STREAM, "planner-p0_c1", ["ty.events.>"], ack_wait_s=2, max_deliver=3)
    from trainyard.bus.topology import ensure_consumer

    await ensure_consumer(bus.js, spec)
    await publish_events(bus, [event("held-by-the-dead")])
    dead = await bus.js.pull_subscribe_bind(spec.durable, EVENTS_STREAM)
    assert len(await dead.fetch(1, timeout=5)) == 1  # fetched, never acknowledged

    recorder = Recorder()
    stop, task = await run_consumer(bus, recorder, spec=spec)
    await publish_events(bus, [event("newer")])
    await recorder.wait_for(lambda seen: ("newer", 1) in seen)
    await asyncio.to_thread(nats_server.restart)
    await recorder.wait_for(lambda seen: ("held-by-the-dead", 1) in seen, timeout=30)
    await stop_consumer(stop, task)


async def test_an_earlier_releases_file_held_events_consumer_moves_to_memory_after_its_acknowledged_floor(bus):
    """Upgrading from a release whose events consumers kept their state in files: created again
    in memory, the consumer delivers after the old one's acknowledged floor, not from the start."""
    spec = ConsumerSpec(EVENTS_STREAM, "status-p1_c1", ["ty.events.>"], ack_wait_s=5)
    await add_file_held(bus, spec)
    await publish_events(bus, [event("handled-before-the-upgrade")])
    old = await bus.js.pull_subscribe_bind(spec.durable, EVENTS_STREAM)
    for msg in await old.fetch(1, timeout=5):
        await msg.ack_sync()
    await publish_events(bus, [event("waiting")])

    assert await read_after_the_upgrade(bus, spec) == [("waiting", 1)]


async def test_a_last_delivery_waits_for_an_unavailable_backend_instead_of_dead_lettering(bus):
    """Found by the soak (bench/soak.py): while a worker's API server restarted (~10 s), its
    status service dead-lettered every TrainJob event it handled, since the redelivery schedule
    (0.25 + 0.5 + 1 + 2 s) ran out first. An unavailable backend is waited for past max_deliver;
    any other error is still dead-lettered at max_deliver (test above)."""
    from trainyard.kube.client import KubeError

    calls = []

    async def handler(delivery: Delivery) -> None:
        calls.append(delivery.num_delivered)
        if len(calls) <= 4:  # the API server answers from the fifth attempt on
            raise KubeError(0, "ConnectionError", "Cannot connect to host 127.0.0.1:6443")

    stop, task = await run_consumer(bus, handler, max_deliver=2)
    await publish_events(bus, [event("j-waits")])
    for _ in range(200):
        if len(calls) >= 5:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    letters = await read_dead_letters(bus)
    await stop_consumer(stop, task)
    assert calls == [1, 2, 3, 4, 5]  # redelivered past max_deliver while the backend did not answer
    assert letters == []
    info = await bus.js.consumer_info(EVENTS_STREAM, "t")
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def test_a_publish_to_a_stream_without_a_leader_is_retried_not_dead_lettered(bus, tmp_path):
    """Found by the soak in a clean-clone run: a NATS node was killed and a worker's planner
    dead-lettered 8 TrainJob events after 5 deliveries with "nats: no response from stream" —
    what a publish to a 3-copy stream answers while the stream has no leader. Reproduced here
    for real: the handler publishes through a follower of a stream on a 3-node cluster whose
    leader and other follower are down (no quorum, no leader); past max_deliver the event is
    still redelivered, never dead-lettered (that it is handled once its backend answers again:
    the test above)."""
    import nats
    from nats.js.api import StreamConfig

    from fixtures.nats import NatsCluster

    cluster = NatsCluster(tmp_path / "cluster")
    cluster.start()
    try:  # the cluster is stopped whatever happens below
        admin = await nats.connect(cluster.url.split(","))
        try:
            for _ in range(150):  # the cluster's meta leader is elected a moment after start
                try:
                    made = await admin.jetstream().add_stream(
                        StreamConfig(name="LEADERLESS", subjects=["leaderless.>"], num_replicas=3))
                    if made.cluster and made.cluster.leader:
                        break
                except Exception:
                    pass
                await asyncio.sleep(0.2)
            leader = (await admin.jetstream().stream_info("LEADERLESS")).cluster.leader
        finally:
            await admin.close()
        names = [f"node-{index}" for index in range(1, len(cluster.nodes) + 1)]  # NatsCluster's server names
        survivor = next(node for node, name in zip(cluster.nodes, names) if name != leader)
        target_nc = await nats.connect(survivor.url)
        target = target_nc.jetstream()
        try:
            # Killed, not stopped: a nats-server stopped with SIGTERM hands the leadership of its
            # streams to another node first (seen within a second here), so stopping the leader,
            # then the other follower, could leave the survivor leading without a quorum for a
            # while, where a publish times out instead of finding no leader (one failure in four
            # runs of the suite's unit and bus tests side by side).
            for node in cluster.nodes:
                if node is not survivor:
                    node.kill()
            errors: list[str] = []

            async def handler(delivery: Delivery) -> None:
                try:
                    await target.publish("leaderless.plan", delivery.data, timeout=2)
                except Exception as err:
                    errors.append(type(err).__name__)
                    raise

            stop, task = await run_consumer(bus, handler, max_deliver=2)
            await publish_events(bus, [event("j-leaderless")])
            for _ in range(300):
                if len(errors) >= 4:  # two deliveries past max_deliver, the stream still without a leader
                    break
                await asyncio.sleep(0.05)
            dead = (await bus.js.stream_info(DEAD_LETTER_STREAM)).state.messages
            info = await bus.js.consumer_info(EVENTS_STREAM, "t")
            await stop_consumer(stop, task)
        finally:
            await target_nc.close()
    finally:
        cluster.stop()
    assert errors[:4] == ["NoStreamResponseError"] * 4, errors
    assert dead == 0
    assert info.num_ack_pending == 1  # still this consumer's, to be redelivered
