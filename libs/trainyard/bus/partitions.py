"""Home replicas: each replica of a role consumes a balanced share of the partitions.

Every TrainJob and everything it owns is published on one partition (``subjects``: a stable
hash of the TrainJob's namespace/name). Each partition has one durable pull consumer per
role and stream (``<role>-p<N>_<cluster>``), so its position survives any change of the
replica that reads it. Which replica reads it is decided on the bus:

* a replica's presence (trainyard.bus.presence): a consumer that nats-server deletes
  ``LEASE_TTL_S`` after the replica's connection closed; the live replicas are the presences
  listed, and every join and loss is announced to all of them.
* ``ty_leases`` ``<role>.<cluster>.p.<N>``: who holds partition N, written with compare-and-set
  (on "no entry", or on the revision of a lease whose holder has no presence). A lease is live
  while its holder's presence is: a steady replica writes nothing to keep its leases.

A replica ticks when a presence of the bus is made or deleted, every ``tick_s`` while its share
is not reached or a hand-over is under way, and every ``STEADY_TICK_S`` otherwise. A tick lists
the live replicas, and reads the leases when the live replicas changed, its share is not
reached, its own presence was made again, or every ``LEASE_CHECK_EVERY`` ticks; it aims at its
share (partitions / replicas, the first ones in name order taking one more of the remainder):
above it, it releases partitions (stop pulling, let the running handlers finish, ``nak`` what
was received and not started, then delete the lease); below it, it takes free partitions. A
replica that stops deletes its leases and its presence; a crashed one's presence is deleted by
nats-server ``LEASE_TTL_S`` later and its partitions are taken at once. A replica that finds its
lease held by another (its presence was gone while it stalled) stops serving that partition. A
lease is a performance property: the ``ty_applied`` compare-and-set claims and resourceVersion
preconditions keep two replicas that both think they own a partition correct (docs/bus.md,
"Partitions and home replicas").
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from nats.js.errors import KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from trainyard.bus.consumer import Consumer, Handler, subject_key
from trainyard.bus.kv import BucketRequests, BucketRequestError, _put
from trainyard.bus.presence import ADVISORIES, Presence, live_replicas
from trainyard.bus.session import BusSession
from trainyard.bus.subjects import encode_token, partitions_setting
from trainyard.bus.topology import (LEASES_BUCKET, ConsumerSpec, durable_name,
                                    partition_durable)
from trainyard.errortext import describe
from trainyard.telemetry import metrics
from trainyard.telemetry.cpu_limit import cpu_limit_cores

log = logging.getLogger(__name__)

# A replica whose share is held and that hands nothing over ticks this often (its consumers'
# pull requests checked, its CPU limit re-read, the live replicas listed); a presence made or
# deleted anywhere on the bus wakes it at once.
STEADY_TICK_S = 5.0
# A steady replica reads the leases every this many ticks (else only when the live replicas or
# its share changed, or its own presence was made again).
LEASE_CHECK_EVERY = 10
# Work in flight is bounded per replica, not per partition. A replica holding all 16 partitions
# used to run up to 16 x 32 handlers at once and buffer up to 16 x 256 pulled messages: its event
# loop's queue of ready tasks was hundreds long, so on a replica at its CPU limit the lease view
# or an admission request waited seconds behind it, and buffered messages outlived their
# ack wait and came again (issue #33). Handlers share REPLICA_CONCURRENCY slots, and each
# partition's pull asks for its share of REPLICA_CREDIT messages.
#
# Both follow the replica's CPU limit (a pod's limits.cpu, read from its cgroup every
# LIMIT_CHECK_S): REPLICA_CONCURRENCY and REPLICA_CREDIT are for a whole core. A replica at
# 0.03 CPU that ran 32 handlers at once stretched each to seconds (its KV reads and the API
# server's admission calls timed out), and the messages it had pulled waited out their ack wait.
REPLICA_CONCURRENCY = 32
REPLICA_CREDIT = 256
MIN_BATCH, MAX_BATCH = 16, 128
MIN_SLOTS = 2
LIMIT_CHECK_S = 5.0
# The presence is kept from a thread of its own (trainyard.bus.presence) while the event loop
# runs a probe within PROGRESS_STALL_S: a busy loop keeps its leases, a hung one loses them. The
# thread probes the loop every PRESENCE_CHECK_S (or half the stall time, if shorter).
PROGRESS_STALL_S = 30.0
PRESENCE_CHECK_S = 5.0


def handler_slots(cpu_limit: float | None) -> int:
    """Handlers a replica runs at once: REPLICA_CONCURRENCY per core of its CPU limit (at least
    MIN_SLOTS, so one slow handler does not hold up the rest), all of them without a limit."""
    if cpu_limit is None:
        return REPLICA_CONCURRENCY
    return max(MIN_SLOTS, min(REPLICA_CONCURRENCY, math.ceil(REPLICA_CONCURRENCY * cpu_limit)))


def pull_batch(target_share: int, subscriptions: int, cpu_limit: float | None = None) -> int:
    """Messages one consumer asks for at once when its replica aims at ``target_share``
    partitions of ``subscriptions`` consumers each (a consumer holds at most two batches).
    Under a CPU limit the replica's credit shrinks with it, down to a message per request."""
    consumers = max(1, target_share) * max(1, subscriptions)
    if cpu_limit is None:
        return max(MIN_BATCH, min(MAX_BATCH, REPLICA_CREDIT // (2 * consumers)))
    credit = max(2 * handler_slots(cpu_limit), round(REPLICA_CREDIT * min(1.0, cpu_limit)))
    return max(1, min(MAX_BATCH, credit // (2 * consumers)))


class HandlerSlots:
    """The handlers a replica runs at once, shared by all its consumers. Unlike a semaphore its
    capacity can change while handlers run (it follows the CPU limit): a smaller capacity takes
    effect as running handlers finish, a larger one wakes waiters at once."""

    def __init__(self, capacity: int) -> None:
        self._capacity = max(1, capacity)
        self._busy = 0
        self._waiting: deque[asyncio.Future[None]] = deque()

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def busy(self) -> int:
        return self._busy

    def resize(self, capacity: int) -> None:
        self._capacity = max(1, capacity)
        self._hand_over()

    async def __aenter__(self) -> None:
        if self._busy < self._capacity and not self._waiting:
            self._busy += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        try:
            await future  # resolved with the slot already counted as ours
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._busy -= 1  # granted as the waiter was cancelled: pass it on
                self._hand_over()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._busy -= 1
        self._hand_over()

    def _hand_over(self) -> None:
        while self._waiting and self._busy < self._capacity:
            future = self._waiting.popleft()
            if not future.done():  # (a cancelled waiter is skipped)
                self._busy += 1
                future.set_result(None)


@dataclass(frozen=True)
class Subscription:
    """One stream a role reads, as one durable consumer per partition."""

    stream: str
    name: str  # the durable's role part: ``planner``, ``status-results``
    filters: Callable[[int], list[str]]  # the subjects partition N reads
    handler: Handler
    ack_wait_s: float = 30.0
    max_deliver: int = 5
    key_of: Callable[[str], str] = subject_key
    coalesce: bool = False
    deliver_new_only: bool = False  # a new durable starts at the stream's end (not its history)

    def spec(self, cluster: str, partition: int) -> ConsumerSpec:
        return ConsumerSpec(self.stream, partition_durable(self.name, cluster, partition), self.filters(partition),
                            ack_wait_s=self.ack_wait_s, max_deliver=self.max_deliver,
                            deliver_new_only=self.deliver_new_only)


def share(partitions: int, members: list[str], me: str) -> int:
    """How many partitions ``me`` should hold among ``members`` (sorted by name)."""
    ordered = sorted(set(members) | {me})
    base, extra = divmod(partitions, len(ordered))
    return base + (1 if ordered.index(me) < extra else 0)


def preference(replica: str, partition: int) -> int:
    """Rendezvous order: a replica takes the free partitions it ranks first, so replicas that
    start together seldom race for the same lease."""
    import hashlib

    return int.from_bytes(hashlib.blake2b(f"{replica}/{partition}".encode(), digest_size=8).digest(), "big")


@dataclass
class _Held:
    revision: int
    stop: asyncio.Event
    tasks: list[asyncio.Task]
    consumers: list[Consumer] = field(default_factory=list)
    releasing: bool = False
    finisher: asyncio.Task | None = None  # the hand-over in progress (drain, then delete the lease)


@dataclass
class PartitionedSubscriber:
    """Runs ``subscriptions`` for the partitions this replica holds, and the leases."""

    bus: BusSession
    role: str
    cluster: str
    subscriptions: list[Subscription]
    service: str = ""
    partitions: int = field(default_factory=partitions_setting)
    replica: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    tick_s: float = 1.0  # the tick while the share is not reached or a hand-over is under way
    # Called when a partition comes or goes: per-partition state is dropped on release.
    on_acquire: Callable[[int], None] | None = None
    on_release: Callable[[int], None] | None = None
    consumer_options: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._held: dict[int, _Held] = {}
        self._kv: KeyValue | None = None
        self._prefix = f"{encode_token(self.role)}.{encode_token(self.cluster)}"
        self.changes = 0  # acquisitions and releases (tests and benchmarks read it)
        self._ticks = 0
        self._seen_members: set[str] = set()
        self._recheck = False  # our presence was made again: the next tick reads the leases
        self._cpu_limit = cpu_limit_cores()
        self._limit_checked = time.monotonic()
        self._slots = HandlerSlots(handler_slots(self._cpu_limit))  # shared by every consumer of the replica
        metrics.HANDLER_SLOTS.labels(self.role).set(self._slots.capacity)
        self._target = self.partitions  # the share aimed at (set each tick)
        self._presence: Presence | None = None
        self._presence_seen = 0  # the presence's generation the leases were last read at
        self._wake = asyncio.Event()  # a presence made or deleted: tick now
        self._reconnects = 0
        metrics.LEASES_LOST.labels(self.role)  # at zero: a healthy run has the series too
        metrics.PRESENCE_WITHDRAWN.labels(self.role)

    @property
    def owned(self) -> set[int]:
        """The partitions this replica serves now (not those it is handing over)."""
        return {p for p, held in self._held.items() if not held.releasing}

    def _lease_key(self, partition: int) -> str:
        return f"{self._prefix}.p.{partition}"

    async def run(self, stop: asyncio.Event) -> None:
        """Holds a share of the partitions until ``stop``, then hands every one over."""
        advisories = []
        stopping = asyncio.create_task(_set_when(stop, self._wake))
        try:
            if not await self._join(stop):
                return
            for subject in ADVISORIES:
                advisories.append(await self.bus.nc.subscribe(subject, cb=self._on_advisory))
            while not stop.is_set():
                self._wake.clear()  # what sets it from here on is seen by this tick or wakes the next
                try:
                    await self._tick()
                except asyncio.CancelledError:
                    raise
                except Exception as err:  # NATS away: the next tick retries
                    log.warning("partition tick of %s failed: %s", self.role, describe(err))
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=self._next_tick_s())
                except asyncio.TimeoutError:
                    pass
        finally:
            stopping.cancel()
            for subscription in advisories:
                try:
                    await subscription.unsubscribe()
                except Exception:  # noqa: BLE001 - the connection is closing
                    pass
            await self._release_all()

    async def _join(self, stop: asyncio.Event) -> bool:
        """Opens the lease bucket and makes this replica's presence; False on ``stop``."""
        self._kv = await self._open(stop, LEASES_BUCKET)
        if self._kv is None:
            return False
        self._presence = Presence(
            self.bus.url, f"{self.bus.name or self.role}-presence", self.role, self.cluster, self.replica,
            check_s=min(PRESENCE_CHECK_S, PROGRESS_STALL_S / 2), stall_s=PROGRESS_STALL_S, on_change=self._wake.set)
        self._presence.start()
        # Present before any lease is taken: a replica that reads a lease and then the live
        # replicas finds every live holder among them (see _tick).
        return await self._presence.wait_registered(stop)

    async def _on_advisory(self, msg) -> None:
        self._wake.set()

    def _next_tick_s(self) -> float:
        settled = (len(self.owned) == self._target and len(self._held) == len(self.owned) and not self._recheck
                   and self._presence is not None and self._presence.generation == self._presence_seen)
        return STEADY_TICK_S if settled else self.tick_s

    async def _open(self, stop: asyncio.Event, bucket: str) -> KeyValue | None:
        attempt = 0
        while not stop.is_set():
            try:
                return await self.bus.js.key_value(bucket)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # created by the bootstrap identity on a secured bus
                attempt += 1
                log.warning("bucket %s not ready (%s); retrying", bucket, err or type(err).__name__)
                try:
                    await asyncio.wait_for(stop.wait(), timeout=min(0.2 * attempt, 2.0))
                except asyncio.TimeoutError:
                    pass
        return None

    async def _entries(self, kv: KeyValue) -> dict[str, tuple[bytes, int]]:
        """The role's entries of ``kv``: one batched direct get."""
        requests = BucketRequests.of(kv)
        request = json.dumps({"multi_last": [f"$KV.{kv._name}.{self._prefix}.>"], "batch": 4096})
        found, _ = await requests._ask(requests._api, request.encode(), 1)
        return found

    async def _live(self) -> list[str]:
        """The live replicas of the role (their presences)."""
        return await live_replicas(self.bus.nc, self.role, self.cluster)

    async def _leases(self) -> dict[int, tuple[str, int]]:
        """Every recorded lease of the role (partition -> holder, revision)."""
        assert self._kv is not None
        leases: dict[int, tuple[str, int]] = {}
        for key, (value, revision) in (await self._entries(self._kv)).items():
            kind, _, ident = key[len(self._prefix) + 1:].partition(".")
            if kind == "p" and ident.isdigit():
                leases[int(ident)] = (value.decode(), revision)
        return leases

    async def _tick(self) -> None:
        assert self._kv is not None and self._presence is not None
        # A steady replica writes nothing: its presence keeps every lease it holds.
        now = time.monotonic()
        for held in self._held.values():  # first: what follows may fail while NATS is away
            for consumer in held.consumers:
                consumer.check_alive(now)
        self._follow_cpu_limit(now)
        # Our presence was made again (withdrawn while our event loop stalled, or forgotten by a
        # restarted nats-server): another replica may have taken our leases meanwhile.
        generation = self._presence.generation
        self._recheck = self._recheck or generation != self._presence_seen
        try:
            members = await self._live()
            if self.replica not in members:
                # Our presence is gone (nats-server restarted and forgot it, or the thread is
                # making it again): take nothing until it is back, then read the leases.
                self._presence.refresh()
                self._recheck = True
                return
            target = share(self.partitions, members, self.replica)
            # The leases (one message per partition) are read only when something may have
            # changed: the live replicas (a join, a stop, a crash), our share not reached yet (a
            # hand-over under way), our presence made again, and every LEASE_CHECK_EVERY ticks.
            self._ticks += 1
            if (set(members) == self._seen_members and len(self.owned) == target and not self._recheck
                    and self._ticks % LEASE_CHECK_EVERY):
                return
            leases = await self._leases()
            # The live replicas again, read after the leases: a replica is present before it
            # takes a lease, so every live holder of a lease read above is in this view. Read
            # only before, a replica that had just joined looked like a dead holder, and both
            # replicas starting at once took the same partitions (the loser later found its lease
            # record deleted and kept serving partitions that no lease named).
            members = await self._live()
            target = share(self.partitions, members, self.replica)
        except BucketRequestError as err:
            log.debug("lease view of %s: %s", self.role, err)
            return
        self._seen_members, self._recheck, self._presence_seen = set(members), False, generation
        for partition, held in list(self._held.items()):
            holder = leases.get(partition, ("", 0))[0]
            # (No lease at all is a copy of a replicated bucket that lags our own write.)
            if holder and holder != self.replica and not held.releasing:
                # Taken over while our presence was gone (a stalled process): stop serving it.
                log.warning("lease of partition %d of %s lost; stopping it", partition, self.role)
                metrics.LEASES_LOST.labels(self.role).inc()
                self._stop(partition, delete_lease=False)
            elif holder == self.replica:
                held.revision = leases[partition][1]
        live = set(members)
        if target != self._target:
            self._target = target
            self._resize_pulls()
        owned = sorted(self.owned, key=lambda p: preference(self.replica, p), reverse=True)
        if len(owned) > target:
            for partition in owned[: len(owned) - target]:  # the ones it ranks last
                self._stop(partition, delete_lease=True)
            return
        # Free: no lease, or one whose holder has no presence.
        free = [p for p in range(self.partitions)
                if p not in self._held and (p not in leases or leases[p][0] not in live)]
        free.sort(key=lambda p: preference(self.replica, p))
        requests = BucketRequests.of(self._kv)
        for partition in free[: max(target - len(owned), 0)]:
            try:
                if partition in leases:  # a dead holder's: compare-and-set on what we read
                    revision = await requests.put_if(self._lease_key(partition), self.replica.encode(),
                                                     leases[partition][1], None)
                else:
                    revision = await _put(self._kv, self._lease_key(partition), self.replica.encode(), None, None)
            except KeyWrongLastSequenceError:
                continue  # another replica took it first
            self._start(partition, revision)

    def _start(self, partition: int, revision: int) -> None:
        stop = asyncio.Event()
        tasks = []
        # The backlog gauges read each consumer's info: spread over the partitions, the role
        # asks about once a second, not once per partition; each gauge is then at most as old as
        # a Prometheus scrape interval (15 s at 16 partitions).
        # The replica's tick checks that each consumer's pull request is alive (check_alive):
        # one timer for all of them, not one each.
        options = {"backlog_interval_s": max(5.0, 1.0 * self.partitions), "slots": self._slots,
                   "batch": self._batch(), "liveness_check_s": None, **self.consumer_options}
        consumers = []
        for subscription in self.subscriptions:
            consumer = Consumer(self.bus.js, subscription.spec(self.cluster, partition), subscription.handler,
                                service=self.service or self.role, publisher=self.bus.publisher,
                                key_of=subscription.key_of, coalesce=subscription.coalesce,
                                label=durable_name(subscription.name, self.cluster), **options)
            consumers.append(consumer)
            tasks.append(asyncio.create_task(consumer.run(stop)))
        self._held[partition] = _Held(revision, stop, tasks, consumers)
        self.changes += 1
        metrics.PARTITIONS_OWNED.labels(self.role).set(len(self.owned))
        log.info("partition acquired", extra={"role": self.role, "partition": partition, "replica": self.replica})
        if self.on_acquire is not None:
            self.on_acquire(partition)

    def _batch(self) -> int:
        return pull_batch(self._target, len(self.subscriptions), self._cpu_limit)

    def _follow_cpu_limit(self, now: float) -> None:
        """Re-reads the replica's CPU limit (it may be set or changed after the start) and sizes
        the handler slots and every consumer's pull to it."""
        if now - self._limit_checked < LIMIT_CHECK_S:
            return
        self._limit_checked = now
        limit = cpu_limit_cores()
        if limit == self._cpu_limit:
            return
        log.info("CPU limit of %s: %s cores", self.role, f"{limit:g}" if limit is not None else "none")
        self._cpu_limit = limit
        self._slots.resize(handler_slots(limit))
        metrics.HANDLER_SLOTS.labels(self.role).set(self._slots.capacity)
        self._resize_pulls()

    def _resize_pulls(self) -> None:
        batch = self._batch()
        for held in self._held.values():
            for consumer in held.consumers:
                consumer.batch = batch

    def _stop(self, partition: int, *, delete_lease: bool) -> asyncio.Task:
        held = self._held[partition]
        held.releasing = True
        held.stop.set()
        metrics.PARTITIONS_OWNED.labels(self.role).set(len(self.owned))
        held.finisher = asyncio.create_task(self._finish_release(partition, held, delete_lease))
        return held.finisher

    async def _finish_release(self, partition: int, held: _Held, delete_lease: bool) -> None:
        """After the partition's consumers drained: forget its state, then free the lease
        (live meanwhile with the replica's presence, so it does not lapse while handlers finish)."""
        await asyncio.gather(*held.tasks, return_exceptions=True)
        if self.on_release is not None:
            self.on_release(partition)
        if delete_lease and self._kv is not None:
            try:
                await self._kv.delete(self._lease_key(partition), last=held.revision)
            except Exception as err:  # renewed concurrently, or lost: it lapses anyway
                log.debug("deleting lease %d of %s: %s", partition, self.role, err)
        self._held.pop(partition, None)
        self.changes += 1
        log.info("partition released", extra={"role": self.role, "partition": partition, "replica": self.replica})

    async def _release_all(self) -> None:
        """Graceful stop: every partition handed over, then the presence withdrawn, so the
        other replicas, woken by its deletion, take the partitions at once."""
        for partition in [p for p, held in self._held.items() if not held.releasing]:
            self._stop(partition, delete_lease=True)
        # Every hand-over, also those a rebalance began: each deletes its lease when drained.
        pending = [held.finisher for held in self._held.values() if held.finisher is not None]
        await asyncio.gather(*pending, return_exceptions=True)
        if self._presence is not None:
            await asyncio.to_thread(self._presence.stop)


async def _set_when(stop: asyncio.Event, wake: asyncio.Event) -> None:
    await stop.wait()
    wake.set()
