"""Home replicas (trainyard.bus.partitions) against a real nats-server: replicas split the
partitions, a graceful stop hands its partitions over at once, a joining replica takes a share,
and every message is handled once, by the replica that holds its partition, at its first
delivery (a released partition's long pull request takes nothing after the hand-over)."""
from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter

import pytest
from nats.js.errors import NoKeysError
from prometheus_client import REGISTRY

from trainyard.bus.consumer import Delivery
from trainyard.bus.envelopes import ObjectEvent, decode
from trainyard.bus import partitions
from trainyard.bus.partitions import PartitionedSubscriber, Subscription, share
from trainyard.bus.publisher import Outgoing
from trainyard.bus.session import BusSession
from trainyard.bus.subjects import event_filter, partition_of_subject
from trainyard.bus.topology import EVENTS_STREAM, LEASES_BUCKET

pytestmark = pytest.mark.timeout(120)

PARTITIONS = 12


def test_shares_add_up_and_differ_by_at_most_one() -> None:
    for members in (["a"], ["a", "b"], ["c", "a", "b"], [f"r{i}" for i in range(8)]):
        shares = [share(PARTITIONS, members, m) for m in members]
        assert sum(shares) == PARTITIONS and max(shares) - min(shares) <= 1


class Replica:
    """One replica: its own bus session, its subscriber, what it handled (subject, partition)."""

    def __init__(self, session: BusSession, name: str, handled: list[tuple[str, str, int]],
                 deliveries: Counter | None = None) -> None:
        self.session = session
        self.name = name
        self.stop = asyncio.Event()

        async def handle(delivery: Delivery) -> None:
            decode(ObjectEvent, delivery.data)
            handled.append((self.name, delivery.subject, partition_of_subject(delivery.subject)))
            if deliveries is not None:
                deliveries[delivery.num_delivered] += 1
            # A partition's messages reach only the replica that holds it.
            assert partition_of_subject(delivery.subject) in self.subscriber.owned | self.releasing()

        self.subscriber = PartitionedSubscriber(
            # A short ack wait: a message lost in a released partition's leftover pull request
            # would come back as a second delivery while the test runs.
            session, "t", "c1", [Subscription(EVENTS_STREAM, "t", lambda p: [event_filter("c1", None, p)], handle,
                                              ack_wait_s=2.0)],
            partitions=PARTITIONS, replica=name, tick_s=0.25)
        self.task = asyncio.create_task(self.subscriber.run(self.stop))

    def releasing(self) -> set[int]:
        return {p for p, held in self.subscriber._held.items() if held.releasing}

    async def close(self) -> None:
        self.stop.set()
        await self.task
        await self.session.close()


async def until(predicate, timeout: float = 30.0) -> None:
    async def loop() -> None:
        while not predicate():
            await asyncio.sleep(0.05)
    await asyncio.wait_for(loop(), timeout)


def balanced(replicas: list[Replica]) -> bool:
    owned = [r.subscriber.owned for r in replicas]
    union = set().union(*owned)
    return union == set(range(PARTITIONS)) and sum(len(o) for o in owned) == PARTITIONS \
        and max(map(len, owned)) - min(map(len, owned)) <= 1


async def publish(session: BusSession, names: list[str]) -> None:
    events = [ObjectEvent.from_object("c1", "ADDED", {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"namespace": "ns", "name": name, "uid": f"u-{name}", "resourceVersion": "1"}}) for name in names]
    await session.publisher.publish_many(Outgoing(e.subject(PARTITIONS), e, e.msg_id()) for e in events)


async def lease_holders(session: BusSession) -> dict[str, str]:
    kv = await session.js.key_value(LEASES_BUCKET)
    try:
        keys = await kv.keys()
    except NoKeysError:  # none at all (a listing that failed is not "no leases")
        return {}
    return {key: (await kv.get(key)).value.decode() for key in keys if ".p." in key}


async def test_replicas_split_hand_over_on_stop_and_a_joiner_takes_a_share(nats_server) -> None:
    handled: list[tuple[str, str, int]] = []
    deliveries: Counter = Counter()  # num_delivered -> messages
    observer = await BusSession.open(nats_server.url, "observer")
    sessions = [await BusSession.open(nats_server.url, f"r{i}") for i in range(3)]
    first, second = Replica(sessions[0], "r1", handled, deliveries), Replica(sessions[1], "r2", handled, deliveries)
    third = None
    try:
        await until(lambda: balanced([first, second]))
        assert len(first.subscriber.owned) == len(second.subscriber.owned) == PARTITIONS // 2

        await publish(observer, [f"a-{i}" for i in range(120)])
        await until(lambda: len(handled) >= 120)

        third = Replica(sessions[2], "r3", handled, deliveries)  # joins: takes about a third
        await until(lambda: balanced([first, second, third]))
        assert len(third.subscriber.owned) == PARTITIONS // 3
        # The partitions r1 and r2 handed to r3 while staying up: their long pull requests
        # must not take messages any more, each goes to r3 at its first delivery.
        await publish(observer, [f"j-{i}" for i in range(120)])
        await until(lambda: len(handled) >= 240)
        assert {who for who, subject, p in handled if ".j-" in subject and p in third.subscriber.owned} == {"r3"}

        await first.close()  # graceful: its leases are deleted before it returns
        holders = await lease_holders(observer)
        assert "r1" not in holders.values(), holders
        await until(lambda: balanced([second, third]), timeout=10)

        await publish(observer, [f"b-{i}" for i in range(120)])
        await until(lambda: len(handled) >= 360)
        await asyncio.sleep(0.5)  # anything handled twice would show by now
        counts = Counter(subject for _, subject, _ in handled)
        assert len(counts) == 360 and set(counts.values()) == {1}, "a message was handled twice or lost"
        # Nothing waited for an ack deadline after a hand-over: every message at its first delivery.
        assert deliveries == Counter({1: 360}), deliveries
        # Every TrainJob's messages went to one partition, and the later ones to the survivors.
        assert {who for who, subject, _ in handled if ".b-" in subject} <= {"r2", "r3"}
    finally:
        for replica in (first, second, third):
            if replica is not None and not replica.task.done():
                await replica.close()
        await observer.close()


def halves(first: Replica, other: dict) -> bool:
    """Replica ``first`` and the one ``in_a_thread`` follows in ``other`` hold half each."""
    return (len(first.subscriber.owned) == len(other["owned"]) == PARTITIONS // 2
            and first.subscriber.owned.isdisjoint(other["owned"]))


def in_a_thread(url: str, name: str, state: dict, done: threading.Event) -> threading.Thread:
    """Replica ``name`` of role t on an event loop of its own (a thread), so that it runs on
    while the test's event loop is held up; ``state`` follows what it owns and its changes."""
    state.setdefault("changes", [])
    state.setdefault("owned", set())

    async def main() -> None:
        own = await BusSession.open(url, name)

        async def handle(delivery: Delivery) -> None:
            return None

        subscriber = PartitionedSubscriber(
            own, "t", "c1", [Subscription(EVENTS_STREAM, "t", lambda p: [event_filter("c1", None, p)], handle)],
            partitions=PARTITIONS, replica=name, tick_s=0.25)
        stop = asyncio.Event()
        task = asyncio.create_task(subscriber.run(stop))
        while not done.is_set():
            state["changes"].append(subscriber.changes)
            state["owned"] = set(subscriber.owned)
            await asyncio.sleep(0.05)
        stop.set()
        await task
        await own.close()

    thread = threading.Thread(target=lambda: asyncio.run(main()))
    thread.start()
    return thread


async def test_a_replica_whose_event_loop_stalls_gives_up_the_partitions_taken_over(nats_server, monkeypatch) -> None:
    """A replica whose event loop stalls loses its presence (its presence thread withdraws it
    when the loop runs no probe for PROGRESS_STALL_S), so another replica takes its leases. When
    its loop runs again it is present again, finds its leases held by the other replica, stops
    serving them and says so; then they share again."""
    monkeypatch.setattr(partitions, "PROGRESS_STALL_S", 1.0)
    handled: list[tuple[str, str, int]] = []
    first = Replica(await BusSession.open(nats_server.url, "s1"), "s1", handled)
    other: dict = {}
    done = threading.Event()
    thread = in_a_thread(nats_server.url, "s2", other, done)
    try:
        await until(lambda: halves(first, other))
        role = first.subscriber.role
        lost_before = REGISTRY.get_sample_value("trainyard_partition_leases_lost_total", {"role": role})
        withdrawn_before = REGISTRY.get_sample_value("trainyard_partition_presence_withdrawn_total", {"role": role})
        held = len(first.subscriber.owned)
        # s1's event loop makes no progress for 8 s: s2 must take every partition meanwhile.
        started = time.monotonic()
        while time.monotonic() - started < 8.0 and len(other["owned"]) < PARTITIONS:
            time.sleep(0.1)
        assert len(other["owned"]) == PARTITIONS, "s2 did not take the stalled replica's partitions"
        # s1 runs again: present again, it finds its leases held by s2 and stops serving them.
        await until(lambda: halves(first, other))
        lost = REGISTRY.get_sample_value("trainyard_partition_leases_lost_total", {"role": role})
        assert lost - lost_before == held
        withdrawn = REGISTRY.get_sample_value("trainyard_partition_presence_withdrawn_total", {"role": role})
        assert withdrawn - withdrawn_before >= 1
    finally:
        done.set()
        await asyncio.to_thread(thread.join, 30)
        await first.close()


async def test_a_busy_event_loop_keeps_its_leases(nats_server) -> None:
    """The presence is kept from a thread of its own (issue #33): a replica whose event loop is
    held up for longer than a presence outlives its connection (3 s) between ticks (a replica
    at its CPU limit with a backlog) keeps every partition; the other replica, on an event loop
    of its own, takes none."""
    handled: list[tuple[str, str, int]] = []
    session = await BusSession.open(nats_server.url, "b1")
    first = Replica(session, "b1", handled)
    other: dict = {}
    done = threading.Event()
    thread = in_a_thread(nats_server.url, "b2", other, done)
    try:
        await until(lambda: halves(first, other))
        await asyncio.sleep(1.0)  # settled
        owned, changes = set(first.subscriber.owned), other["changes"][-1]
        for _ in range(2):
            time.sleep(4.5)  # b1's event loop held up past the lease's TTL, then it ticks
            await asyncio.sleep(0.5)
        assert first.subscriber.owned == owned
        assert other["changes"][-1] == changes, "b2 took a partition of the busy replica"
    finally:
        done.set()
        await asyncio.to_thread(thread.join, 30)
        await first.close()


async def test_replicas_starting_at_once_never_take_each_others_partitions(nats_server) -> None:
    """Two replicas whose first ticks interleave: r2 takes its leases after r1 listed the live
    replicas and before r1 reads the leases. r1 must see r2's
    leases as a live replica's, not a dead holder's (ciR17: both took the same partitions, and
    the loser went on serving two whose lease records the winner had deleted)."""
    handled: list[tuple[str, str, int]] = []
    sessions = [await BusSession.open(nats_server.url, f"i{i}") for i in range(2)]

    def subscriber(session: BusSession, name: str) -> PartitionedSubscriber:
        async def handle(delivery: Delivery) -> None:
            handled.append((name, delivery.subject, partition_of_subject(delivery.subject)))
        return PartitionedSubscriber(
            session, "t", "c1", [Subscription(EVENTS_STREAM, "t", lambda p: [event_filter("c1", None, p)], handle)],
            partitions=PARTITIONS, replica=name, tick_s=0.25)

    first, second = subscriber(sessions[0], "r1"), subscriber(sessions[1], "r2")
    running = asyncio.Event()
    for replica in (first, second):
        assert await replica._join(running)  # present, nothing taken yet
    first_leases = first._leases

    async def leases_after_the_other_replica_joined():
        await second._tick()  # r2: sees r1 and itself, takes its half
        return await first_leases()

    first._leases = leases_after_the_other_replica_joined  # type: ignore[method-assign]
    try:
        await first._tick()
        assert len(second.owned) == PARTITIONS // 2
        assert first.owned.isdisjoint(second.owned), (sorted(first.owned), sorted(second.owned))
        assert first.owned | second.owned == set(range(PARTITIONS))
        # Every lease names the one replica that serves its partition.
        holders = await lease_holders(sessions[0])
        assert holders == {first._lease_key(p): name for name, replica in (("r1", first), ("r2", second))
                           for p in replica.owned}, holders
    finally:
        for replica in (first, second):
            await replica._release_all()
        for session in sessions:
            await session.close()


class InFlight:
    """A handler that records how many of its calls ran at once, and the subjects it handled."""

    def __init__(self) -> None:
        self.running = 0
        self.most = 0
        self.done: list[str] = []

    async def handle(self, delivery: Delivery) -> None:
        self.running += 1
        self.most = max(self.most, self.running)
        await asyncio.sleep(0.02)
        self.running -= 1
        self.done.append(delivery.subject)


@contextlib.asynccontextmanager
async def one_replica_holding_every_partition(url: str, handler: InFlight):
    """Replica w1 of role w on cluster c1, once it holds all PARTITIONS; yields it and a session
    to publish with."""
    session = await BusSession.open(url, "w1")
    observer = await BusSession.open(url, "observer")
    subscriber = PartitionedSubscriber(
        session, "w", "c1", [Subscription(EVENTS_STREAM, "w", lambda p: [event_filter("c1", None, p)], handler.handle)],
        partitions=PARTITIONS, replica="w1", tick_s=0.25)
    stop = asyncio.Event()
    task = asyncio.create_task(subscriber.run(stop))
    try:
        await until(lambda: len(subscriber.owned) == PARTITIONS)
        yield subscriber, observer
    finally:
        stop.set()
        await task
        await session.close()
        await observer.close()


async def test_a_replica_holding_every_partition_runs_at_most_its_share_of_handlers_at_once(nats_server,
                                                                                          monkeypatch) -> None:
    """Handlers in flight are bounded per replica, not per partition (issue #33): one replica
    holding all the partitions with a burst on every one of them runs REPLICA_CONCURRENCY at
    once (it ran 32 per partition, so the lease view or an admission request waited behind
    hundreds of ready tasks on a replica at its CPU limit)."""
    monkeypatch.setattr(partitions, "REPLICA_CONCURRENCY", 3)
    handler = InFlight()
    async with one_replica_holding_every_partition(nats_server.url, handler) as (_, observer):
        await publish(observer, [f"c-{i}" for i in range(90)])  # many objects: many lanes at once
        await until(lambda: len(handler.done) >= 90)
        assert handler.most == 3, handler.most


async def test_a_replica_sizes_its_handlers_and_pulls_to_a_cpu_limit_set_after_it_started(nats_server,
                                                                                          monkeypatch) -> None:
    """A bench (or a pod resized in place) applies the quota once the replica runs: at 0.03 CPU
    it runs MIN_SLOTS handlers at once and pulls a message at a time; when the limit goes, it
    is back to REPLICA_CONCURRENCY."""
    limit: list[float | None] = [None]
    monkeypatch.setattr(partitions, "cpu_limit_cores", lambda: limit[0])
    monkeypatch.setattr(partitions, "LIMIT_CHECK_S", 0.1)
    handler = InFlight()
    async with one_replica_holding_every_partition(nats_server.url, handler) as (subscriber, observer):
        consumers = lambda: [c for held in subscriber._held.values() for c in held.consumers]  # noqa: E731
        assert subscriber._slots.capacity == partitions.REPLICA_CONCURRENCY
        assert {c.batch for c in consumers()} == {partitions.pull_batch(PARTITIONS, 1)}
        limit[0] = 0.03
        await until(lambda: subscriber._slots.capacity == partitions.MIN_SLOTS)
        assert {c.batch for c in consumers()} == {partitions.pull_batch(PARTITIONS, 1, 0.03)}
        await publish(observer, [f"c-{i}" for i in range(40)])
        await until(lambda: len(handler.done) >= 40)
        assert handler.most == partitions.MIN_SLOTS, handler.most
        limit[0] = None
        await until(lambda: subscriber._slots.capacity == partitions.REPLICA_CONCURRENCY)
        assert {c.batch for c in consumers()} == {partitions.pull_batch(PARTITIONS, 1)}


def test_each_pull_asks_for_its_share_of_the_replicas_credit() -> None:
    assert partitions.pull_batch(16, 1) == 16  # 256 / (2 x 16), at least MIN_BATCH
    assert partitions.pull_batch(2, 1) == 64
    assert partitions.pull_batch(1, 1) == 128  # one partition: as before
    assert partitions.pull_batch(16, 2) == partitions.MIN_BATCH  # the status service: two streams
    assert partitions.pull_batch(0, 1) == 128
