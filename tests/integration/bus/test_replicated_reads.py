"""Reads of 3-copy buckets on a real 3-node JetStream cluster (docs/bus.md, "Reads"): a write
just acknowledged on one node is read back through another, in one request for a whole batch;
a reader whose floor no copy has reached yet reads on the stream leader and still gets the
latest values; the floor travels on published messages."""
from __future__ import annotations

import pytest

from trainyard.bus import readfloor
from trainyard.bus.envelopes import ObjectEvent
from trainyard.bus.kv import BucketRequests, _remove
from trainyard.bus.session import BusSession
from trainyard.bus.subjects import ObjectKey, event_subject, kv_key
from trainyard.bus.topology import EVENTS_STREAM, SNAPSHOTS_BUCKET
from trainyard.telemetry import metrics

pytestmark = pytest.mark.timeout(120)

ROUNDS = 60


def jobset(name: str, rv: int) -> dict:
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": str(rv)}}


def kv_ops(op: str) -> float:
    return metrics.KV_OPERATIONS.labels(SNAPSHOTS_BUCKET, op)._value.get()


async def test_writes_acknowledged_on_one_node_are_read_back_through_another_in_one_request(
        nats_cluster_module) -> None:
    writer = await BusSession.open(nats_cluster_module.nodes[0].url, "watcher")
    reader = await BusSession.open(nats_cluster_module.nodes[2].url, "planner")
    try:
        info = await reader.js.stream_info(f"KV_{SNAPSHOTS_BUCKET}")
        assert info.config.num_replicas == 3 and info.config.allow_direct
        assert await BucketRequests.of(reader.snapshots._kv).checked()
        # A planner's read: the TrainJob's own key, its runtime and absent children, batched.
        keys = [ObjectKey("c", "JobSet", "ns", "fresh"), ObjectKey("c", "JobSet", "ns", "other"),
                *(ObjectKey("c", "PodGroup", "ns", f"absent-{i}") for i in range(9))]
        await writer.snapshots.record(keys[1], jobset("other", 1))
        requests_before, leader_before = reader.nc.stats["out_msgs"], kv_ops("get_leader")
        for rv in range(1, ROUNDS + 1):
            assert await writer.snapshots.record(keys[0], jobset("fresh", rv))
            # What the writer's next published message carries, handled by the reader.
            readfloor.merge_header(reader.nc, readfloor.header_value(writer.nc))
            found = await reader.snapshots.get_many(keys)
            assert found[0]["metadata"]["resourceVersion"] == str(rv), f"round {rv}: a stale read"
            assert found[1]["metadata"]["name"] == "other" and found[2:] == [None] * 9
        fallbacks = kv_ops("get_leader") - leader_before
        # One request per batch of 11 keys, plus the leader's gets when a copy lagged.
        assert reader.nc.stats["out_msgs"] - requests_before == ROUNDS + fallbacks * len(keys)
        print(f"{ROUNDS} batched reads of {len(keys)} keys: {fallbacks:.0f} went to the stream leader")

        # A tombstone and a removed entry read as absent, batched or not.
        tomb, removed = ObjectKey("c", "JobSet", "ns", "tomb"), ObjectKey("c", "JobSet", "ns", "removed")
        await writer.snapshots.record(tomb, jobset("tomb", 1))
        await writer.snapshots.record(tomb, jobset("tomb", 2), deleted=True)
        await writer.snapshots.record(removed, jobset("removed", 1))
        await _remove(writer.snapshots._kv, kv_key(removed), 60)
        readfloor.merge_header(reader.nc, readfloor.header_value(writer.nc))
        assert await reader.snapshots.get_many([tomb, removed, keys[1]]) == [None, None, found[1]]
        assert [await reader.snapshots.get(key) for key in (tomb, removed)] == [None, None]

        # Keys none of which exists: still one request, answered by the floor marker's copy.
        before = reader.nc.stats["out_msgs"]
        assert await reader.snapshots.get_many(keys[2:4]) == [None, None]
        assert await reader.snapshots.get(keys[5]) is None
        assert reader.nc.stats["out_msgs"] - before == 2
    finally:
        await writer.close()
        await reader.close()


async def test_a_floor_no_copy_reached_reads_on_the_leader(nats_cluster_module) -> None:
    writer = await BusSession.open(nats_cluster_module.nodes[1].url, "watcher")
    reader = await BusSession.open(nats_cluster_module.nodes[0].url, "status")
    try:
        key = ObjectKey("c", "JobSet", "ns", "ahead")
        await writer.snapshots.record(key, jobset("ahead", 7))
        # As if a message named a write no copy has applied yet: the checked read cannot trust
        # any copy's answer and asks the stream leader (which has the latest value).
        readfloor.raise_floor(reader.nc, SNAPSHOTS_BUCKET, readfloor.floor(writer.nc, SNAPSHOTS_BUCKET) + 1000)
        leader_before = kv_ops("get_leader")
        found = await reader.snapshots.get(key)
        assert found is not None and found["metadata"]["resourceVersion"] == "7"
        assert kv_ops("get_leader") - leader_before == 1
    finally:
        await writer.close()
        await reader.close()


async def test_published_messages_carry_the_publishers_floor(nats_cluster_module) -> None:
    session = await BusSession.open(nats_cluster_module.url, "watcher")
    try:
        key = ObjectKey("c", "JobSet", "ns", "carried")
        await session.snapshots.record(key, jobset("carried", 3))
        written = readfloor.floor(session.nc, SNAPSHOTS_BUCKET)
        assert written > 0
        subject = event_subject(key, 0)
        event = ObjectEvent(cluster="c", type="ADDED", kind="JobSet", apiVersion="jobset.x-k8s.io/v1alpha2",
                            namespace="ns", name="carried", uid="uid-carried", resourceVersion="3", generation=1,
                            object=jobset("carried", 3))
        await session.publisher.publish(subject, event, "carried-3")
        stored = await session.js.get_last_msg(EVENTS_STREAM, subject)
        assert f"{SNAPSHOTS_BUCKET}={written}" in stored.headers[readfloor.HEADER].split(",")
    finally:
        await session.close()


async def test_scans_right_after_their_consumer_is_created_never_fail(nats_cluster_module) -> None:
    """Every scan (the dashboard's and the watcher's first reads) makes a consumer of a 3-copy
    stream and pulls from it at once; until that consumer's leader is elected a pull has no
    responder (503). One scan in ~70 failed so, and `trainyard up --nats-cluster 3` exited when
    the dashboard's start was the one. A scan waits for the leader instead."""
    from trainyard.bus.kv import scan_last_per_subject

    session = await BusSession.open(nats_cluster_module.nodes[1].url, "watcher")
    try:
        bucket = session.snapshots._kv
        await bucket.put("default.jobsets.ns.scanned", b"{}")
        seen = []
        for _ in range(300):
            found = []
            await scan_last_per_subject(session.js, f"KV_{bucket._name}", f"$KV.{bucket._name}.>", found.append)
            seen.append(len(found))
        assert set(seen) == {len(found)} and len(found) >= 1
    finally:
        await session.close()
