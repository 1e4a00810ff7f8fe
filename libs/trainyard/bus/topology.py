"""Streams, KV buckets and durable consumers, declared once and created idempotently.

Every service calls :func:`ensure_topology` at start: creating what is missing and updating a
stream whose config changed, so several replicas starting together is safe.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    ConsumerInfo,
    DeliverPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BadRequestError, NotFoundError

from trainyard.bus import subjects
from trainyard.errortext import describe

log = logging.getLogger(__name__)

EVENTS_STREAM = "TY_EVENTS"
PLANS_STREAM = "TY_PLANS"
RESULTS_STREAM = "TY_RESULTS"
DEAD_LETTER_STREAM = "TY_DEAD_LETTER"
PROGRESS_STREAM = "TY_PROGRESS"

SNAPSHOTS_BUCKET = "ty_objects"
APPLIED_BUCKET = "ty_applied"
OUTCOMES_BUCKET = "ty_outcomes"
# Replica membership and partition leases (trainyard.bus.partitions): a replica's presence is a
# consumer on ty_members' stream that nats-server deletes LEASE_TTL_S after the replica's
# connection closed (trainyard.bus.presence); a lease (ty_leases) is live while its holder's
# presence is, so a crashed replica's leases lapse with its presence. Nothing writes ty_members.
LEASES_BUCKET = "ty_leases"
MEMBERS_BUCKET = "ty_members"
# Presences are consumers on the members bucket's stream; their creation and deletion are
# announced on these advisories (trainyard.bus.presence).
PRESENCE_STREAM = f"KV_{MEMBERS_BUCKET}"
PRESENCE_ADVISORIES = tuple(f"$JS.EVENT.ADVISORY.CONSUMER.{event}.{PRESENCE_STREAM}.*" for event in ("CREATED", "DELETED"))
LEASE_TTL_S = 3.0
# The worker slots held by delegated TrainJobs, one entry per manager and worker, written with
# compare-and-set by every dispatcher replica (trainyard.multicluster.slots).
SLOTS_BUCKET = "ty_slots"

DEDUP_WINDOW_S = 120.0

# Every partition consumer keeps its state (delivered and acknowledged positions) in memory:
# nats-server writes a file-held consumer's state up to ten times a second while it is busy, and
# with one durable per partition and stream that was a third of its CPU under load
# (docs/performance.md, "One replica: where the CPU per TrainJob went"). A restart of
# nats-server loses such a consumer; its reader creates it again (consumer.py). On a work-queue
# stream the stream is the position (what it holds is exactly what was not acknowledged), so the
# consumer is created as it was; on the other streams, whose messages stay after they are read,
# the reader creates it from the last position it knows everything up to was acknowledged
# (Consumer.resume_after), so nothing is skipped and what is handled again is handled by
# level-triggered handlers.
WORK_QUEUE_STREAMS = frozenset({PLANS_STREAM})

# The progress history kept per TrainJob (docs/bus.md): its last PROGRESS_POINTS reports (the
# oldest go first), for PROGRESS_MAX_AGE_S at most, and PROGRESS_MAX_BYTES for all TrainJobs.
PROGRESS_POINTS = 1000
PROGRESS_MAX_AGE_S = 7 * 24 * 3600.0
PROGRESS_MAX_BYTES = 256 * 1024 * 1024

# How many copies JetStream keeps of each stream and bucket: 1 on a laptop, 3 on a NATS cluster
# (deploy/ sets 3) so that losing a NATS node loses nothing. Read when the topology is ensured.
REPLICAS_ENV = "TRAINYARD_BUS_REPLICAS"


def replicas_setting(env: dict[str, str] | None = None) -> int:
    """``$TRAINYARD_BUS_REPLICAS`` (1 to 5, JetStream's limit); 1 when unset."""
    import os

    raw = (os.environ if env is None else env).get(REPLICAS_ENV, "").strip() or "1"
    try:
        replicas = int(raw)
    except ValueError:
        raise ValueError(f"${REPLICAS_ENV}: expected a number of replicas (1 to 5), got {raw!r}") from None
    if not 1 <= replicas <= 5:
        raise ValueError(f"${REPLICAS_ENV}: must be between 1 and 5, got {replicas}")
    return replicas


def replicas_for_nodes(nodes: int) -> int:
    """The copies a NATS cluster of ``nodes`` nodes gets (``trainyard up --nats-cluster``,
    bench/e2e.py): 3, or every node of a smaller one."""
    return min(nodes, 3)


def stream_configs(storage: StorageType = StorageType.FILE, replicas: int | None = None) -> list[StreamConfig]:
    """The five streams of the bus contract (docs/bus.md), each with ``replicas`` copies
    (default: :func:`replicas_setting`)."""
    replicas = replicas or replicas_setting()
    return [
        # Events: a replayable log of observed changes; dedup drops the second watcher's copy.
        StreamConfig(
            name=EVENTS_STREAM,
            subjects=[f"{subjects.EVENTS_PREFIX}.>"],
            retention=RetentionPolicy.LIMITS,
            storage=storage,
            num_replicas=replicas,
            duplicate_window=DEDUP_WINDOW_S,
            max_age=24 * 3600.0,
            max_msgs_per_subject=64,
        ),
        # Plans: work to do, removed once an applier acknowledged it.
        StreamConfig(
            name=PLANS_STREAM,
            subjects=[f"{subjects.PLANS_PREFIX}.>"],
            retention=RetentionPolicy.WORK_QUEUE,  # (WORK_QUEUE_STREAMS)
            storage=storage,
            num_replicas=replicas,
            duplicate_window=DEDUP_WINDOW_S,
        ),
        StreamConfig(
            name=RESULTS_STREAM,
            subjects=[f"{subjects.RESULTS_PREFIX}.>"],
            retention=RetentionPolicy.LIMITS,
            storage=storage,
            num_replicas=replicas,
            duplicate_window=DEDUP_WINDOW_S,
            max_age=24 * 3600.0,
        ),
        StreamConfig(
            name=DEAD_LETTER_STREAM,
            subjects=[f"{subjects.DEAD_LETTER_PREFIX}.>"],
            retention=RetentionPolicy.LIMITS,
            storage=storage,
            num_replicas=replicas,
            max_age=7 * 24 * 3600.0,
        ),
        # Progress reports: a bounded history per TrainJob (one subject each) for the charts.
        StreamConfig(
            name=PROGRESS_STREAM,
            subjects=[f"{subjects.PROGRESS_PREFIX}.>"],
            retention=RetentionPolicy.LIMITS,
            storage=storage,
            num_replicas=replicas,
            duplicate_window=DEDUP_WINDOW_S,
            max_age=PROGRESS_MAX_AGE_S,
            max_msgs_per_subject=PROGRESS_POINTS,
            max_bytes=PROGRESS_MAX_BYTES,
        ),
    ]


# The buckets whose reads must see every write the reader depends on. Replicated, any copy may
# answer a direct get, possibly one that has not stored a write just acknowledged, so their reads
# are batched direct gets checked against the reader's floor (trainyard.bus.readfloor); the key
# FLOOR_KEY (one token: no listing's filter matches it) always exists in them so that every
# answer names the answering copy's last sequence.
CHECKED_BUCKETS = (SNAPSHOTS_BUCKET, APPLIED_BUCKET, OUTCOMES_BUCKET)
FLOOR_KEY = "trainyard-read-floor"


def bucket_configs(storage: StorageType = StorageType.FILE, replicas: int | None = None) -> list[KeyValueConfig]:
    """The buckets, allowing direct gets (``ty_slots`` only with one copy): a read is answered
    from the stream's store without the JSON API (cheaper for both ends) and several keys can be
    read with one request (``SnapshotStore.get_many``). With several copies, reads of the three
    data buckets are checked against the reader's floor (docs/bus.md, "Reads")."""
    replicas = replicas or replicas_setting()
    direct = True
    return [
        KeyValueConfig(bucket=SNAPSHOTS_BUCKET, history=1, storage=storage, replicas=replicas, direct=direct,
                       description="latest snapshot of every watched object"),
        KeyValueConfig(bucket=APPLIED_BUCKET, history=1, storage=storage, replicas=replicas, direct=direct,
                       description="last applied plan per TrainJob (compare-and-set)"),
        KeyValueConfig(bucket=OUTCOMES_BUCKET, history=1, storage=storage, replicas=replicas, direct=direct,
                       description="last planning/apply error per TrainJob"),
        # Read with one batched direct get per heartbeat, whatever the copies: a lagging copy's
        # answer only delays taking a free partition (every lease write is compare-and-set on
        # the stream leader). On file like the rest: a bucket that vanished with a restarted
        # NATS would leave a replica that had not leased yet with nothing to serve.
        KeyValueConfig(bucket=MEMBERS_BUCKET, history=1, storage=storage, replicas=replicas, direct=True,
                       ttl=LEASE_TTL_S, description="replica heartbeats of the partitioned roles"),
        KeyValueConfig(bucket=LEASES_BUCKET, history=1, storage=storage, replicas=replicas, direct=True,
                       description="partition leases: held while the holder's heartbeat lives"),
        # Replicated, read on the stream leader (``STREAM.MSG.GET``, unchecked direct gets could
        # be stale): few reads, one per placement.
        KeyValueConfig(bucket=SLOTS_BUCKET, history=1, storage=storage, replicas=replicas, direct=replicas == 1,
                       description="worker slots held by delegated TrainJobs (compare-and-set)"),
    ]


def partition_durable(role: str, cluster: str, partition: int) -> str:
    """The durable consumer of one partition of a role: ``<role>-p<N>_<cluster token>``."""
    return durable_name(f"{role}-p{partition}", cluster)


def durable_name(role: str, cluster: str) -> str:
    """The durable consumer of one service role for one cluster: ``<role>_<cluster token>``.

    Several clusters share one NATS, so each cluster's planner/applier/status needs consumers
    of its own: one shared name would split (and, with a filter per cluster, drop) the other
    cluster's messages. Roles never contain ``_``, so the first ``_`` separates role and cluster.
    """
    if "_" in role:
        raise ValueError(f"consumer role {role!r} must not contain '_'")
    return f"{role}_{subjects.encode_token(cluster)}"


@dataclass(frozen=True)
class ConsumerSpec:
    """A durable pull consumer: explicit ack, bounded redelivery, then the dead letter."""

    stream: str
    durable: str
    filter_subjects: list[str]
    ack_wait_s: float = 30.0
    max_deliver: int = 5
    max_ack_pending: int = 4096
    deliver_new_only: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def resumable(self) -> bool:
        """Whether a position can be given at creation: not on a work-queue stream, where the
        stream itself is the position (WORK_QUEUE_STREAMS)."""
        return self.stream not in WORK_QUEUE_STREAMS

    def config(self, resume_after: int | None = None) -> ConsumerConfig:
        """The consumer's configuration; ``resume_after``: create it to deliver from the next
        stream sequence (when ``resumable``)."""
        many = len(self.filter_subjects) > 1
        deliver, start = (DeliverPolicy.NEW if self.deliver_new_only else DeliverPolicy.ALL), None
        if resume_after is not None and self.resumable:
            deliver, start = DeliverPolicy.BY_START_SEQUENCE, resume_after + 1
        return ConsumerConfig(
            durable_name=self.durable,
            name=self.durable,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait_s,
            # Unlimited on the server: the consumer counts deliveries itself and dead-letters
            # at max_deliver, except while the handler's backend is unavailable (consumer.py);
            # a server limit would silently drop a message whose last delivery was in flight.
            max_deliver=-1,
            max_ack_pending=self.max_ack_pending,
            deliver_policy=deliver,
            opt_start_seq=start,
            filter_subject=None if many else self.filter_subjects[0],
            filter_subjects=self.filter_subjects if many else None,
            mem_storage=True,
            **self.extra,
        )


async def ensure_streams(js: JetStreamContext, storage: StorageType = StorageType.FILE) -> None:
    for config in stream_configs(storage):
        try:
            await js.add_stream(config)
        except BadRequestError:
            # Exists with another config (e.g. an older release): bring it to ours.
            await js.update_stream(config)


async def ensure_buckets(js: JetStreamContext, storage: StorageType = StorageType.FILE) -> None:
    for config in bucket_configs(storage):
        try:
            kv = await js.key_value(config.bucket)
        except Exception:  # BucketNotFoundError (and a half-created bucket) -> create
            await js.create_key_value(config)
            continue
        if bool(kv._direct) != bool(config.direct):
            # A bucket of an earlier release (replicated ones had no direct gets): turn them on.
            stream = (await js.stream_info(f"KV_{config.bucket}")).config
            stream.allow_direct = config.direct
            await js.update_stream(stream)
    if replicas_setting() > 1:
        for bucket in CHECKED_BUCKETS:
            await ensure_floor_marker(js, bucket)


async def ensure_floor_marker(js: JetStreamContext, bucket: str) -> None:
    """Writes the bucket's FLOOR_KEY entry unless it exists (a create: safe from any number of
    replicas). Without it a read of keys that all lack entries cannot be checked and goes to
    the stream leader."""
    ack = await js._nc.request(f"$KV.{bucket}.{FLOOR_KEY}", b"every read of a replicated bucket names it (docs/bus.md)",
                               timeout=5.0, headers={"Nats-Expected-Last-Subject-Sequence": "0"})
    answer = ack.data.decode(errors="replace")
    if '"error"' in answer and "wrong last sequence" not in answer.lower():
        raise BadRequestError(description=f"{bucket}: writing {FLOOR_KEY}: {answer}")


async def ensure_topology(js: JetStreamContext, storage: StorageType = StorageType.FILE) -> None:
    """Creates (or updates) every stream and bucket; safe to call from any number of replicas."""
    await ensure_streams(js, storage)
    await ensure_buckets(js, storage)


async def ensure_consumer(js: JetStreamContext, spec: ConsumerSpec,
                          resume_after: int | None = None) -> ConsumerInfo:
    """Creates the durable consumer, or brings an existing one to ``spec`` in place.

    A missing consumer is created to deliver after ``resume_after`` when given (its reader's
    known position, after nats-server forgot the consumer in a restart), else from the start
    (or new messages only). An existing consumer keeps its position and how it was created; a
    change the server refuses to apply in place keeps the existing consumer: losing its position
    would be worse than running with the old limits. A file-held consumer of an earlier release
    is created again in memory (the server cannot change the storage in place) from its
    acknowledged floor: nothing it had not acknowledged is skipped.
    """
    try:
        info = await js.consumer_info(spec.stream, spec.durable)
    except NotFoundError:
        return await _create_consumer(js, spec, resume_after)
    existing = info.config
    if not existing.mem_storage:
        floor = info.ack_floor.stream_seq if info.ack_floor else 0
        log.info("consumer %s moves its state to memory, resuming after stream sequence %d",
                 spec.durable, floor)
        await js.delete_consumer(spec.stream, spec.durable)
        return await _create_consumer(js, spec, floor or None)
    config = spec.config()
    # The position lives in the consumer: keep where it was created to start.
    config.deliver_policy, config.opt_start_seq = existing.deliver_policy, existing.opt_start_seq
    try:
        return await js.add_consumer(spec.stream, config=config)
    except BadRequestError as err:
        log.warning("consumer %s kept with its existing config: %s", spec.durable, describe(err))
        return info


async def _create_consumer(js: JetStreamContext, spec: ConsumerSpec, resume_after: int | None) -> ConsumerInfo:
    if resume_after is not None and spec.resumable:
        last = (await js.stream_info(spec.stream)).state.last_seq
        if resume_after > last:
            # The stream itself is younger than the position (deleted and created again by
            # hand): its sequences started over, so everything it holds is new to this reader.
            log.warning("stream %s restarts below consumer %s's position %d (last sequence %d); "
                        "reading it from the start", spec.stream, spec.durable, resume_after, last)
            resume_after = None
    return await js.add_consumer(spec.stream, config=spec.config(resume_after))
