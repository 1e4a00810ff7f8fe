"""Each role's backlog as the watcher exports it for autoscalers (trainyard.bus.backlog), against
a secured nats-server: the watcher's own identity lists the three streams' consumers (and may
not list another stream's), every durable of a role counts whether a replica reads it or not,
status adds its results consumer, another cluster's roles stay out but the bus-wide
dispatcher's are in, and a listing of more than one page (256 consumers) is read whole."""
from __future__ import annotations

import asyncio

import pytest
from nats.js.api import AckPolicy, ConsumerConfig
from prometheus_client import REGISTRY

from trainyard.bus.auth import Credentials
from trainyard.bus.backlog import export_role_backlogs, parse_durable, read_backlogs, role_backlogs
from trainyard.telemetry.scrape import refresh_metrics
from trainyard.bus.connection import connect
from trainyard.bus.subjects import encode_token
from trainyard.bus.topology import EVENTS_STREAM, PLANS_STREAM, PROGRESS_STREAM, RESULTS_STREAM

pytestmark = pytest.mark.timeout(120)


def credentials(server, role: str, cluster: str | None = "default") -> Credentials:
    return Credentials.load(server.security.credentials_for(role, cluster))


async def durable(js, stream: str, name: str, subject: str) -> None:
    await js.add_consumer(stream, ConsumerConfig(durable_name=name, filter_subject=subject,
                                                 ack_policy=AckPolicy.EXPLICIT))


async def publish(js, subject: str, count: int) -> None:
    for index in range(count):
        await js.publish(f"{subject}.ns.job-{index}", b"{}")


def test_parse_durable() -> None:
    assert parse_durable("planner-p3_default") == ("planner", "default")
    assert parse_durable("status-results-p15_worker-1") == ("status-results", "worker-1")
    assert parse_durable("status-results_default") == ("status-results", "default")  # before partitions
    assert parse_durable(f"applier-p0_{encode_token('a.b_c')}") == ("applier", "a.b_c")
    assert parse_durable("Xk3jd8") is None  # a short-lived consumer


def test_the_watcher_reads_each_roles_backlog_with_its_own_grants(secure_nats_server) -> None:
    async def main() -> None:
        admin = await connect(secure_nats_server.url, "test-admin", credentials=credentials(secure_nats_server, "admin"))
        watcher = await connect(secure_nats_server.url, "test-watcher", credentials=credentials(secure_nats_server, "watcher"))
        try:
            js = admin.jetstream()
            # Two planner partitions (3 + 2 events), one applier partition (4 plans), the status
            # service's events and results consumers (1 + 2), another cluster's planner (7), and
            # the manager's dispatcher (named after the other cluster: it reads every cluster).
            await durable(js, EVENTS_STREAM, "planner-p0_default", "ty.events.default.p0.>")
            await durable(js, EVENTS_STREAM, "planner-p1_default", "ty.events.default.p1.>")
            await durable(js, PLANS_STREAM, "applier-p0_default", "ty.desired.default.p0.>")
            await durable(js, EVENTS_STREAM, "status-p0_default", "ty.events.default.p0.TrainJob.>")
            await durable(js, RESULTS_STREAM, "status-results-p0_default", "ty.results.default.p0.>")
            await durable(js, EVENTS_STREAM, "planner-p0_other", "ty.events.other.p0.>")
            await durable(js, EVENTS_STREAM, "dispatcher-p0_other", "ty.events.*.p0.TrainJob.>")
            await publish(js, "ty.events.default.p0.TrainJob", 1)
            await publish(js, "ty.events.default.p0.JobSet", 2)
            await publish(js, "ty.events.default.p1.TrainJob", 2)
            await publish(js, "ty.desired.default.p0.TrainJob", 4)
            await publish(js, "ty.results.default.p0.TrainJob", 2)
            await publish(js, "ty.events.other.p0.JobSet", 7)
            # One plan delivered and not acknowledged: ack-pending is work left too.
            sub = await js.pull_subscribe_bind("applier-p0_default", PLANS_STREAM)
            (held,) = await sub.fetch(1, timeout=5)
            assert held.metadata.num_delivered == 1

            backlogs = await read_backlogs(watcher.jetstream())
            figures = {(b.consumer, b.cluster): (b.durables, b.pending, b.ack_pending) for b in backlogs}
            assert figures == {
                ("planner", "default"): (2, 5, 0), ("applier", "default"): (1, 3, 1),
                ("status", "default"): (1, 1, 0), ("status-results", "default"): (1, 2, 0),
                ("planner", "other"): (1, 7, 0), ("dispatcher", "other"): (1, 1, 0),
            }
            assert role_backlogs(backlogs, "default") == {
                ("planner", "default"): 5, ("applier", "default"): 4, ("status", "default"): 3,
                ("dispatcher", "other"): 1}
            assert role_backlogs(backlogs, "other") == {("planner", "other"): 7, ("dispatcher", "other"): 1}

            # The exported gauge, read when /metrics is scraped, and a role whose durables go
            # away loses its series.
            stop = asyncio.Event()
            exporter = asyncio.create_task(export_role_backlogs(watcher.jetstream(), "default", stop,
                                                                min_interval_s=0.0))
            await asyncio.sleep(0)  # registered
            sample = lambda role, cluster="default": REGISTRY.get_sample_value(  # noqa: E731
                "trainyard_role_backlog_messages", {"role": role, "cluster": cluster})
            await refresh_metrics()
            assert (sample("planner"), sample("applier"), sample("status"), sample("dispatcher", "other")) == (5, 4, 3, 1)
            assert sample("planner", "other") is None
            await js.delete_consumer(RESULTS_STREAM, "status-results-p0_default")
            await js.delete_consumer(EVENTS_STREAM, "dispatcher-p0_other")
            assert (sample("status"), sample("dispatcher", "other")) == (3, 1)  # not read again: no scrape
            await refresh_metrics()
            assert (sample("status"), sample("dispatcher", "other")) == (1, None)
            stop.set()
            await exporter
            await refresh_metrics()  # no longer read: the figures stay as last read
            assert sample("status") == 1

            # Least privilege: the listing of these three streams, nothing else.
            with pytest.raises(Exception):
                await watcher.jetstream().consumers_info(PROGRESS_STREAM)
        finally:
            await watcher.close()
            await admin.close()

    asyncio.run(main())


def test_a_listing_of_more_than_one_page_is_read_whole(nats_server) -> None:
    async def main() -> None:
        from trainyard.bus.topology import ensure_topology

        nc = await connect(nats_server.url, "test")
        try:
            js = nc.jetstream()
            await ensure_topology(js)
            await asyncio.gather(*(durable(js, RESULTS_STREAM, f"status-results-p{i}_paging", f"ty.results.paging.p{i}.>")
                                   for i in range(300)))
            await publish(js, "ty.results.paging.p299.TrainJob", 3)
            (backlog,) = [b for b in await read_backlogs(js) if b.cluster == "paging"]
            assert (backlog.consumer, backlog.durables, backlog.pending) == ("status-results", 300, 3)
        finally:
            await nc.close()

    asyncio.run(main())
