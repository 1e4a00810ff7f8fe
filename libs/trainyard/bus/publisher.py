"""Publishing envelopes with ``Nats-Msg-Id`` and trace context, one at a time or pipelined.

One awaited JetStream publish at a time is a round trip per message (a few hundred msg/s in
nats-py). :meth:`Publisher.publish_many` sends a whole batch first and then awaits all the
acknowledgements, which keeps the connection busy instead of idle.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Iterable

from opentelemetry import context as otel_context

from nats.js import JetStreamContext
from nats.js.api import PubAck

from trainyard.bus import readfloor
from trainyard.bus.envelopes import Envelope, encode
from trainyard.bus.tracing import inject_headers, publish_span
from trainyard.telemetry import metrics

MSG_ID_HEADER = "Nats-Msg-Id"


async def last_published_ids(js: JetStreamContext, stream: str, filter_subject: str) -> dict[str, str]:
    """Subject -> ``Nats-Msg-Id`` of the last message the stream holds on it, for every subject
    matching ``filter_subject`` (one pass, headers only)."""
    from trainyard.bus.kv import scan_last_per_subject

    found: dict[str, str] = {}

    def visit(msg: Any) -> None:
        found[msg.subject] = (msg.headers or {}).get(MSG_ID_HEADER, "")

    await scan_last_per_subject(js, stream, filter_subject, visit, headers_only=True)
    return found


@dataclass(frozen=True)
class Outgoing:
    subject: str
    envelope: Envelope
    msg_id: str
    # The trace context to publish under (e.g. the watcher's observation of the object);
    # None: the current one.
    context: Any = None


class Publisher:
    def __init__(self, js: JetStreamContext, service: str, timeout_s: float = 10.0) -> None:
        self._js = js
        self._service = service
        self._timeout_s = timeout_s

    def _headers(self, msg_id: str) -> dict[str, str]:
        headers = {MSG_ID_HEADER: msg_id}
        # What this process knows was written to the replicated buckets: whoever handles the
        # message reads at least that far (trainyard.bus.readfloor; none on a single-copy bus).
        floors = readfloor.header_value(self._js._nc)
        if floors:
            headers[readfloor.HEADER] = floors
        return inject_headers(headers)

    async def publish(self, subject: str, envelope: Envelope, msg_id: str) -> PubAck:
        """Publishes one envelope and waits for the stream's acknowledgement."""
        with publish_span(subject, msg_id):
            ack = await self._js.publish(
                subject, encode(envelope), timeout=self._timeout_s, headers=self._headers(msg_id)
            )
        self._count(subject, ack)
        return ack

    async def publish_many(self, items: Iterable[Outgoing]) -> list[PubAck]:
        """Sends all messages, then awaits every acknowledgement (pipelined)."""
        futures: list[asyncio.Future[PubAck]] = []
        subjects: list[str] = []
        for item in items:
            token = otel_context.attach(item.context) if item.context is not None else None
            try:
                with publish_span(item.subject, item.msg_id):
                    future = await self._js.publish_async(
                        item.subject, encode(item.envelope), headers=self._headers(item.msg_id)
                    )
            finally:
                if token is not None:
                    otel_context.detach(token)
            futures.append(future)
            subjects.append(item.subject)
        if not futures:
            return []
        acks = await asyncio.wait_for(asyncio.gather(*futures), timeout=self._timeout_s)
        for subject, ack in zip(subjects, acks):
            self._count(subject, ack)
        return list(acks)

    def _count(self, subject: str, ack: PubAck) -> None:
        kind = subject.split(".")[1] if "." in subject else subject
        result = "duplicate" if ack.duplicate else "stored"
        metrics.PUBLISHED.labels(self._service, kind, result).inc()
