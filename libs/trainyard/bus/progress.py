"""The progress history of each TrainJob: every report a trainer made, on the bus.

The status endpoint publishes one :class:`ProgressReport` per accepted report to
``ty.progress.<cluster>.TrainJob.<namespace>.<name>`` (stream ``TY_PROGRESS``). The stream keeps
the last ``PROGRESS_POINTS`` reports of each TrainJob (JetStream's per-subject limit drops the
oldest), so the history is bounded whatever the number of reports, and it outlives any process
that shows it: the dashboard reads it back when a page asks, and follows new reports with a
plain subscription to the same subjects.
"""
from __future__ import annotations

import logging
import uuid
from typing import Any

from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from trainyard.bus.envelopes import EnvelopeError, ProgressReport, decode
from trainyard.bus.publisher import Publisher
from trainyard.bus.subjects import progress_subject
from trainyard.bus.topology import PROGRESS_POINTS, PROGRESS_STREAM

log = logging.getLogger(__name__)


def report_of(cluster: str, written: dict[str, Any], at: float) -> ProgressReport:
    """The report a status write made, from the TrainJob the API server answered with (its uid
    and resourceVersion after the write, and ``status.trainerStatus`` as stored)."""
    meta = written.get("metadata") or {}
    reported = (written.get("status") or {}).get("trainerStatus") or {}
    return ProgressReport(
        cluster=cluster, namespace=meta.get("namespace", ""), name=meta.get("name", ""), uid=meta.get("uid", ""),
        resourceVersion=str(meta.get("resourceVersion", "")), at=at,
        lastUpdatedTime=reported.get("lastUpdatedTime"), progressPercentage=reported.get("progressPercentage"),
        estimatedRemainingSeconds=reported.get("estimatedRemainingSeconds"),
        metrics=[m for m in reported.get("metrics") or [] if isinstance(m, dict)],
    )


async def publish_report(publisher: Publisher, report: ProgressReport) -> None:
    """Stores one report; a redelivered or repeated one (same uid and resourceVersion) is
    dropped by the stream's dedup window."""
    await publisher.publish(progress_subject(report.cluster, report.namespace, report.name), report,
                            report.msg_id())


async def read_history(js: JetStreamContext, cluster: str, namespace: str, name: str,
                       uid: str | None = None, timeout_s: float = 5.0) -> list[ProgressReport]:
    """The stored reports of one TrainJob, oldest first (at most ``PROGRESS_POINTS``); with
    ``uid``, only that TrainJob's (a TrainJob created again under the same name starts anew).

    Read with a short-lived pull consumer filtered on the TrainJob's subject, deleted right
    after (its name is random; the grant binds the filter to the reader's clusters)."""
    subject = progress_subject(cluster, namespace, name)
    consumer = f"progress-{uuid.uuid4().hex}"
    info = await js.add_consumer(PROGRESS_STREAM, config=ConsumerConfig(
        name=consumer, deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE, filter_subject=subject,
        inactive_threshold=10.0, mem_storage=True,
    ))
    reports: list[ProgressReport] = []
    try:
        remaining = info.num_pending
        if remaining == 0:
            return reports
        sub = await js.pull_subscribe_bind(consumer=consumer, stream=PROGRESS_STREAM)
        try:
            while remaining > 0:
                for msg in await sub.fetch(min(remaining, PROGRESS_POINTS), timeout=timeout_s):
                    remaining = msg.metadata.num_pending
                    try:
                        report = decode(ProgressReport, msg.data)
                    except EnvelopeError as err:
                        log.warning("skipping an unreadable progress report on %s: %s", subject, err)
                        continue
                    if uid is None or report.uid == uid:
                        reports.append(report)
        finally:
            await sub.unsubscribe()
    finally:
        try:
            await js.delete_consumer(PROGRESS_STREAM, consumer)
        except Exception:  # noqa: BLE001 - it expires on its own (inactive_threshold)
            pass
    return reports
