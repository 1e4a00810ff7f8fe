"""Durable pull consumers: per-object serial, cross-object parallel, explicit ack.

What a consumer's long pull request delivers is split into lanes by object key (taken from the
subject): one lane handles its messages strictly in order, different lanes run concurrently
(bounded). A handler that
returns acknowledges the message; one that raises gets the message redelivered with backoff
(``nak`` with delay) until ``max_deliver``, after which — or at once for
:class:`PermanentError` — the message is copied to the dead-letter stream with the error and
terminated, and the consumer goes on with the next one. A message whose handler failed only
because its backend did not answer (:func:`unavailable`) is redelivered until it answers, never
dead-lettered; so the server's own redelivery limit is off (the limit is counted here), and a
message in flight when its consumer stops or dies is redelivered to the next one.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, AsyncContextManager, Awaitable, Callable, TypeVar

from nats.aio.msg import Msg
from nats.errors import ConnectionClosedError, NoRespondersError, TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.errors import NoStreamResponseError, ServiceUnavailableError

from trainyard.bus import readfloor, subjects
from trainyard.bus.envelopes import DEAD_LETTER_DATA_MAX, DeadLetter, Envelope, EnvelopeError, decode
from trainyard.bus.publisher import Publisher
from trainyard.bus.topology import ConsumerSpec, ensure_consumer
from trainyard.bus.tracing import consume_span
from trainyard.errortext import describe
from trainyard.telemetry import metrics

log = logging.getLogger(__name__)

# A pull request waits this long on the server for messages, and says it is alive this often
# (docs/bus.md, "Pulling"; the server takes at most half the expiry). The heartbeat is the last
# resort for a request lost without a word: a reconnect is seen at once, and a request open on a
# consumer leader that dies with its NATS node is served by the leader elected next
# (tests/integration/bus/test_consumer_leader.py). An idle replica holds a consumer per partition
# and stream (32 for a status replica at 16 partitions): 3.2 heartbeats a second at 10 s, 1.1 at
# 30 s (issue #33).
PULL_EXPIRES_S = 60.0
PULL_HEARTBEAT_S = 30.0
# With nothing arriving, the pull loop of a consumer run on its own wakes this often to check
# that its request is alive (a lapse needs two missed heartbeats and 5 s more). A replica's
# consumers have no such timer: its tick checks them all (check_alive).
LIVENESS_CHECK_S = 5.0
# An idle consumer's backlog is known without asking (see Consumer._known_idle); it is still
# read this often, in case a pull request was lost without the server saying so.
IDLE_BACKLOG_REFRESH_S = 300.0


class PermanentError(Exception):
    """Retrying cannot help (bad payload, rejected object): dead-letter now."""


@dataclass(frozen=True)
class Delivery:
    """What a handler sees of one message."""

    subject: str
    data: bytes
    headers: dict[str, str]
    num_delivered: int
    stream_sequence: int
    consumer: str = ""  # the durable that delivered it
    published_at: float = 0.0  # time.time() when the stream stored it (0: unknown)


Handler = Callable[[Delivery], Awaitable[None]]
Message = TypeVar("Message", bound=Envelope)


def decoding(envelope: type[Message], handle: Callable[[Message, Delivery], Awaitable[None]]) -> Handler:
    """The handler of a consumer whose messages are ``envelope``s: each is decoded before
    ``handle`` sees it, and one that does not decode is dead-lettered (a PermanentError: no
    redelivery would decode it)."""
    async def handler(delivery: Delivery) -> None:
        try:
            message = decode(envelope, delivery.data)
        except EnvelopeError as err:
            raise PermanentError(str(err)) from None
        await handle(message, delivery)
    return handler


def subject_key(subject: str) -> str:
    """The lane key: the object tokens at the end of the subject."""
    return ".".join(subject.split(".")[-4:])


def redelivery_delay(num_delivered: int) -> float:
    return min(0.25 * (2 ** max(min(num_delivered, 16) - 1, 0)), 10.0)


def unavailable(err: BaseException) -> bool:
    """Whether a handler failed because what it talks to did not answer (an API server
    restarting, a bus node electing a leader): waiting helps, unlike for any other error.
    Errors say so with a true ``unavailable`` attribute (trainyard.kube.client.KubeError).
    From the bus: a timeout, a closed connection, and a stream or consumer with no leader for
    the moment — a publish or KV write gets no responder (``NoStreamResponseError``), an API
    request a 503 — which on a 3-node cluster lasts as long as the election after a node died."""
    return bool(getattr(err, "unavailable", False)) or isinstance(
        err, (NatsTimeoutError, ConnectionClosedError, NoRespondersError, NoStreamResponseError,
              ServiceUnavailableError))


@dataclass
class _Lane:
    messages: deque[Msg] = field(default_factory=deque)
    task: asyncio.Task | None = None


class Consumer:
    def __init__(
        self,
        js: JetStreamContext,
        spec: ConsumerSpec,
        handler: Handler,
        *,
        service: str,
        publisher: Publisher,
        key_of: Callable[[str], str] = subject_key,
        batch: int = 128,
        concurrency: int = 32,
        backlog_interval_s: float = 2.0,
        coalesce: bool = False,
        label: str | None = None,
        slots: AsyncContextManager[Any] | None = None,
        liveness_check_s: float | None = LIVENESS_CHECK_S,
    ) -> None:
        self._js = js
        self._spec = spec
        self._handler = handler
        self._service = service
        self._publisher = publisher
        self._key_of = key_of
        self._batch = batch
        # Handlers running at once: ``concurrency`` of this consumer's own, or ``slots`` shared
        # with the other consumers of a replica (trainyard.bus.partitions).
        self._slots = slots if slots is not None else asyncio.Semaphore(concurrency)
        self._lanes: dict[str, _Lane] = {}
        self._pending = 0
        self._stopping = False
        self._credit = 0  # messages the outstanding pull requests may still deliver
        self._arrivals = 0  # messages delivered so far (the backlog watch compares it)
        self._delivered = asyncio.Event()  # set by each delivery: wakes an idle backlog watch
        self._heard = time.monotonic()  # last message or heartbeat of a pull request
        self._wake = asyncio.Event()
        # None: whoever runs this consumer calls check_alive() (a replica's tick does, for
        # all the consumers it holds, instead of a timer in each of them).
        self._liveness_check_s = liveness_check_s
        self._reconnects_seen = 0
        self._recreate_next = False
        self._inbox = ""
        self._next_subject = ""
        self._backlog_interval_s = backlog_interval_s
        self._started: dict[int, float] = {}  # id(msg) -> monotonic start of its handler
        # Where to resume should nats-server forget the consumer (its state is held in memory:
        # topology.WORK_QUEUE_STREAMS's comment): the stream sequences delivered here and not
        # yet acknowledged or terminated, the highest delivered, and the server's own
        # acknowledged floor. ``_sole`` once the server showed nothing pending outside this
        # reader (no previous holder's message still unacknowledged): from then on what was
        # delivered here is all that was delivered.
        self._unfinished: set[int] = set()
        self._highest = 0
        self._server_floor = 0
        self._sole = False
        self._bound: Any = None  # the consumer info the bind got
        # Metrics and spans carry ``label`` (a role's one name, e.g. planner_<cluster>, for all its
        # partitions' consumers), the backlog gauges the durable itself.
        self._label = label or spec.durable
        metrics.init_consumer_metrics(service, self._label)
        # The labelled series of every message, looked up once (``labels()`` per message and
        # metric added up to several per cent of a service's samples).
        name = self._label
        self._received = metrics.RECEIVED.labels(service, name)
        self._redelivered = metrics.REDELIVERED.labels(service, name)
        self._adds = metrics.WORKQUEUE_ADDS.labels(name)
        self._queue_duration = metrics.WORKQUEUE_QUEUE_DURATION.labels(name)
        self._processed_duration = metrics.PROCESSED_DURATION.labels(service, name)
        self._reconcile_time = metrics.RECONCILE_TIME.labels(name)
        self._work_duration = metrics.WORKQUEUE_WORK_DURATION.labels(name)
        self._reconciled: dict[str, Any] = {}
        # Level-triggered handlers read the current state: of several queued messages for one
        # subject (one object), only the newest needs a pass (a deletion is always kept).
        self._coalesce = coalesce
        self._coalesced = metrics.COALESCED.labels(service, name)

    @property
    def name(self) -> str:
        return self._spec.durable

    @property
    def batch(self) -> int:
        return self._batch

    @batch.setter
    def batch(self, batch: int) -> None:
        """Messages each later pull request asks for (the replica resizes it to its share and
        CPU limit); what is outstanding is kept."""
        self._batch = max(1, batch)

    def resume_after(self) -> int:
        """The stream sequence up to which every message of this consumer is acknowledged, as
        far as this reader knows: a consumer created again to deliver after it skips nothing
        (it may deliver again what was acknowledged since the server's floor was last read)."""
        if not self._sole:
            return self._server_floor
        if self._unfinished:
            return min(self._unfinished) - 1
        return max(self._highest, self._server_floor)

    def _note_server_floor(self, info: Any) -> None:
        floor = info.ack_floor.stream_seq if info.ack_floor else 0
        self._server_floor = max(self._server_floor, floor or 0)
        if not info.num_ack_pending:
            self._sole = True

    def _finished(self, msg: Msg) -> None:
        self._unfinished.discard(msg.metadata.sequence.stream)

    async def run(self, stop: asyncio.Event) -> None:
        """Pulls and handles messages until ``stop`` is set, then drains (see :meth:`drain`).

        One long-lived pull instead of a fetch a second: a request for ``batch`` messages that
        waits ``PULL_EXPIRES_S`` on the server, with an idle heartbeat every
        ``PULL_HEARTBEAT_S``; the next request goes out when half of the outstanding credit has
        arrived. An idle consumer costs one request per ``PULL_EXPIRES_S`` and a heartbeat per
        ``PULL_HEARTBEAT_S`` (a 1-s fetch cost two requests and two status replies a second).
        """
        if not await self._bind(stop):
            return
        nc = self._js._nc
        self._inbox = nc.new_inbox()
        self._next_subject = f"{self._js._prefix}.CONSUMER.MSG.NEXT.{self._spec.stream}.{self._spec.durable}"
        sub = await nc.subscribe(self._inbox, cb=self._arrived)
        backlog = asyncio.create_task(self._watch_backlog(stop))
        stopped = asyncio.ensure_future(stop.wait())
        stopped.add_done_callback(lambda _: self._wake.set())
        self._reconnects_seen = nc.stats.get("reconnects", 0)
        try:
            while not stop.is_set():
                now = time.monotonic()
                if self._lost(now) or self._recreate_next:
                    # A server that restarted (or a consumer re-created) forgot the request:
                    # its heartbeats stop. Make sure the consumer exists and ask again.
                    refused, self._recreate_next = self._recreate_next, False
                    self._reconnects_seen = nc.stats.get("reconnects", 0)
                    self._credit = 0
                    self._heard = now
                    await self._recreate(stop)
                    if refused:  # not again at once, whatever made the server refuse it
                        await _sleep_or_stop(stop, 0.5)
                        continue
                if self._credit <= self._batch // 2 and self._pending < self._batch * 2:
                    try:
                        await self._request(nc)
                    except (ConnectionClosedError, asyncio.CancelledError):
                        raise
                    except Exception as err:  # disconnected: nats-py reconnects, we ask again
                        log.warning("pull from %s failed: %s", self.name, describe(err))
                        await _sleep_or_stop(stop, 0.5)
                        continue
                self._wake.clear()
                if self._liveness_check_s is None:
                    # Woken when half the credit has arrived, a request ended, a handler freed
                    # room under back-pressure, at stop, or by check_alive().
                    await self._wake.wait()
                    continue
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=self._liveness_check_s)
                except asyncio.TimeoutError:
                    pass
        finally:
            stopped.cancel()
            backlog.cancel()
            await asyncio.gather(backlog, stopped, return_exceptions=True)
            self._stopping = True
            # Hand-over: the server forgets our pending request once it sees our interest gone
            # (it checks the reply subject's interest before each delivery), and what it sent
            # before that arrives before the flush's reply: nak'ed at once, so the partition's
            # next holder gets it without waiting for the ack deadline.
            try:
                await sub.drain()
            except Exception:
                pass
            await self.drain()

    def _lost(self, now: float) -> bool:
        """Whether the open pull request is gone: the connection was re-established since it
        was sent (a restarted server forgot it), or no heartbeat came for two periods and 5 s
        more (an event loop that stalled is not a lost request)."""
        nc = self._js._nc
        lapsed = self._credit > 0 and now - self._heard > min(PULL_HEARTBEAT_S, PULL_EXPIRES_S / 2) * 2 + 5
        return lapsed or nc.stats.get("reconnects", 0) != self._reconnects_seen

    def check_alive(self, now: float) -> None:
        """Wakes the pull loop when its request is lost (see :meth:`_lost`); called every second
        by the replica that holds this consumer when it has no timer of its own."""
        if self._lost(now):
            self._wake.set()

    async def _request(self, nc) -> None:
        # (The server refuses a heartbeat of more than half the expiry.)
        request = {"batch": self._batch, "expires": int(PULL_EXPIRES_S * 1e9),
                   "idle_heartbeat": int(min(PULL_HEARTBEAT_S, PULL_EXPIRES_S / 2) * 1e9)}
        await nc.publish(self._next_subject, json.dumps(request).encode(), reply=self._inbox)
        if self._credit <= 0:
            self._heard = time.monotonic()  # nothing was outstanding: its liveness counts from now
        self._credit += self._batch

    async def _arrived(self, msg: Msg) -> None:
        """The pull subscription's callback: a message, or a status of a request."""
        self._heard = time.monotonic()
        headers = msg.headers
        status = headers.get("Status") if headers else None
        if status is not None and not msg.reply:
            if status == "100":  # idle heartbeat: the request is alive
                return
            # 408 expired, 409 (batch completed, leadership change, consumer deleted, too many
            # waiting requests...), 404/400: that request ended with what it had not delivered.
            left = headers.get("Nats-Pending-Messages")
            self._credit = max(self._credit - int(left), 0) if left and left.isdigit() else 0
            if status not in ("408", "409") or "Deleted" in (headers.get("Description") or ""):
                log.warning("pull from %s ended: %s %s", self.name, status, headers.get("Description", ""))
                self._recreate_next = True  # make sure the consumer exists before asking again
            self._wake.set()
            return
        if self._stopping:
            await _quietly(msg.nak())  # the partition is being handed over: to the next holder
            return
        self._credit -= 1
        self._arrivals += 1
        self._delivered.set()
        sequence = msg.metadata.sequence.stream
        self._unfinished.add(sequence)
        if sequence > self._highest:
            self._highest = sequence
        if self._credit <= self._batch // 2:
            self._wake.set()
        self._enqueue(msg)

    async def _bind(self, stop: asyncio.Event) -> bool:
        """Creates the durable consumer, retrying while JetStream is unavailable."""
        attempt = 0
        while not stop.is_set():
            try:
                self._bound = await ensure_consumer(self._js, self._spec)
                self._note_server_floor(self._bound)
                return True
            except (ConnectionClosedError, asyncio.CancelledError):
                raise
            except Exception as err:
                attempt += 1
                log.warning("consumer %s not ready (%s); retrying", self.name, describe(err))
                await _sleep_or_stop(stop, min(0.2 * attempt, 2.0))
        return False

    async def _recreate(self, stop: asyncio.Event) -> None:
        try:
            self._note_server_floor(await ensure_consumer(self._js, self._spec, self.resume_after()))
        except (ConnectionClosedError, asyncio.CancelledError):
            raise
        except Exception as err:  # still away: the next round asks again
            log.warning("consumer %s not ready (%s); retrying", self.name, describe(err))
            await _sleep_or_stop(stop, 0.5)

    def _known_idle(self, arrived: int, last_info: float, last_backlog: int, now: float) -> bool:
        """Nothing can be waiting: a pull request with credit is open (the server would have
        delivered anything pending), nothing arrived since the last look, nothing is in hand,
        and the last look saw no backlog. Then consumer info is asked only every
        ``IDLE_BACKLOG_REFRESH_S`` (it was most of an idle replica's bus traffic)."""
        return (self._credit > 0 and self._pending == 0 and arrived == self._arrivals
                and last_backlog == 0 and now - last_info < IDLE_BACKLOG_REFRESH_S)

    async def _watch_backlog(self, stop: asyncio.Event) -> None:
        """The real backlog: JetStream's consumer info (pending, ack-pending, redelivered), and
        the work in progress here, every ``backlog_interval_s``. The first reading is the one
        the bind got. While nothing can be waiting (``_known_idle``) it sleeps until a delivery
        or ``IDLE_BACKLOG_REFRESH_S``: a replica holds a consumer per partition and stream (32
        for a status replica at 16 partitions), and their watches woke it twice a second for
        nothing (issue #33: an idle replica should cost almost nothing)."""
        arrived, last_info, last_backlog = -1, float("-inf"), -1
        if self._bound is not None:
            arrived, last_info, last_backlog = self._arrivals, time.monotonic(), self._show_backlog(self._bound)
            await _sleep_or_stop(stop, self._backlog_interval_s)
        while not stop.is_set():
            now = time.monotonic()
            running = [now - began for began in self._started.values()]
            metrics.WORKQUEUE_UNFINISHED_WORK.labels(self.name).set(sum(running))
            metrics.WORKQUEUE_LONGEST_RUNNING.labels(self.name).set(max(running, default=0.0))
            if self._known_idle(arrived, last_info, last_backlog, now):
                self._delivered.clear()
                await _wait_either(stop, self._delivered, IDLE_BACKLOG_REFRESH_S - (now - last_info))
                continue
            arrived = self._arrivals
            try:
                info = await self._js.consumer_info(self._spec.stream, self.name, timeout=2.0)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # disconnected or consumer being re-created: next round
                log.debug("consumer info of %s failed: %s", self.name, describe(err))
                last_backlog = -1
            else:
                self._note_server_floor(info)
                last_info, last_backlog = now, self._show_backlog(info)
            await _sleep_or_stop(stop, self._backlog_interval_s)

    def _show_backlog(self, info: Any) -> int:
        """Sets the backlog gauges from a consumer info; returns pending + ack-pending."""
        labels = (self._spec.stream, self.name)
        pending, ack_pending = info.num_pending or 0, info.num_ack_pending or 0
        metrics.JETSTREAM_PENDING.labels(*labels).set(pending)
        metrics.JETSTREAM_ACK_PENDING.labels(*labels).set(ack_pending)
        metrics.JETSTREAM_REDELIVERED.labels(*labels).set(info.num_redelivered or 0)
        metrics.JETSTREAM_DELIVERED.labels(*labels).set((info.delivered.stream_seq if info.delivered else 0) or 0)
        metrics.WORKQUEUE_DEPTH.labels(self.name).set(pending + ack_pending)
        return pending + ack_pending

    async def drain(self, grace_s: float = 10.0) -> None:
        """Graceful stop: running handlers finish; queued, unstarted messages are nak'ed."""
        self._stopping = True
        for lane in self._lanes.values():
            while len(lane.messages) > 1:
                msg = lane.messages.pop()
                await _quietly(msg.nak())
                self._done_one()
        tasks = [lane.task for lane in self._lanes.values() if lane.task]
        if tasks:
            await asyncio.wait(tasks, timeout=grace_s)

    def _enqueue(self, msg: Msg) -> None:
        self._received.inc()
        self._adds.inc()
        self._pending += 1
        key = self._key_of(msg.subject)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane()
        if self._coalesce and len(lane.messages) > 1:
            self._supersede(lane, msg.subject)
        lane.messages.append(msg)
        if lane.task is None:
            lane.task = asyncio.create_task(self._run_lane(key, lane))

    def _supersede(self, lane: _Lane, subject: str) -> None:
        """Acknowledges the queued (not started: the first one may be running) messages of
        ``subject`` that the new one makes redundant."""
        kept: deque[Msg] = deque([lane.messages[0]])
        for queued in list(lane.messages)[1:]:
            msg_id = (queued.headers or {}).get("Nats-Msg-Id", "")
            if queued.subject == subject and not msg_id.endswith(":DELETED"):
                asyncio.get_running_loop().create_task(_quietly(queued.ack()))
                self._finished(queued)
                self._coalesced.inc()
                self._done_one()
                continue
            kept.append(queued)
        lane.messages = kept

    async def _run_lane(self, key: str, lane: _Lane) -> None:
        try:
            while lane.messages:
                msg = lane.messages[0]
                async with self._slots:
                    await self._handle(msg)
                lane.messages.popleft()
                self._done_one()
                if self._stopping:
                    while lane.messages:
                        await _quietly(lane.messages.popleft().nak())
                        self._done_one()
        finally:
            lane.task = None
            if not lane.messages:
                self._lanes.pop(key, None)

    def _done_one(self) -> None:
        self._pending -= 1
        if self._pending == self._batch:
            self._wake.set()  # back-pressure lifted: the pull loop may ask for more

    async def _handle(self, msg: Msg) -> None:
        meta = msg.metadata
        if meta.num_delivered > 1:
            self._redelivered.inc()
        published = meta.timestamp.timestamp() if meta.timestamp else time.time()
        self._queue_duration.observe(max(time.time() - published, 0.0))
        delivery = Delivery(
            subject=msg.subject,
            data=msg.data,
            headers=dict(msg.headers or {}),
            num_delivered=meta.num_delivered,
            stream_sequence=meta.sequence.stream,
            consumer=self._spec.durable,
            published_at=published,
        )
        # The publisher's read floors: what it wrote before publishing is read back here.
        readfloor.merge_header(self._js._nc, delivery.headers.get(readfloor.HEADER))
        started = time.perf_counter()
        self._started[id(msg)] = time.monotonic()
        try:
            with consume_span(msg.subject, msg.headers, self._label):
                await self._handler(delivery)
        except asyncio.CancelledError:
            await _quietly(msg.nak())
            raise
        except PermanentError as err:
            await self._dead_letter(msg, delivery, f"{err}")
            self._record("dead_letter", started)
            return
        except Exception as err:
            text = f"{type(err).__name__}: {err}"
            # A backend that did not answer (an API server restarting takes longer than the
            # redelivery schedule) is waited for, never a reason to give the message up.
            if delivery.num_delivered >= self._spec.max_deliver and not unavailable(err):
                await self._dead_letter(msg, delivery, text)
                self._record("dead_letter", started)
            else:
                log.warning(
                    "handler failed; will retry",
                    extra={"consumer": self.name, "subject": msg.subject,
                           "deliveries": delivery.num_delivered, "error": text},
                )
                await _quietly(msg.nak(delay=redelivery_delay(delivery.num_delivered)))
                metrics.WORKQUEUE_RETRIES.labels(self._label).inc()
                self._record("error", started)
            return
        finally:
            self._started.pop(id(msg), None)
        await _quietly(msg.ack())
        self._finished(msg)
        self._record("success", started)

    def _record(self, result: str, started: float) -> None:
        elapsed = time.perf_counter() - started
        self._processed_duration.observe(elapsed)
        total = self._reconciled.get(result)
        if total is None:
            total = self._reconciled[result] = metrics.RECONCILE_TOTAL.labels(self._label, result)
        total.inc()
        self._reconcile_time.observe(elapsed)
        self._work_duration.observe(elapsed)
        if result != "success":
            metrics.RECONCILE_ERRORS.labels(self._label).inc()

    async def _dead_letter(self, msg: Msg, delivery: Delivery, error: str) -> None:
        letter = DeadLetter(
            stream=self._spec.stream,
            consumer=self.name,
            subject=msg.subject,
            deliveries=delivery.num_delivered,
            error=error,
            data=base64.b64encode(msg.data[:DEAD_LETTER_DATA_MAX]).decode("ascii"),
            headers={k: v for k, v in delivery.headers.items()},
            truncated=len(msg.data) > DEAD_LETTER_DATA_MAX,
        )
        subject = subjects.dead_letter_subject(msg.subject)
        msg_id = f"dead:{self._spec.stream}:{self.name}:{delivery.stream_sequence}"
        log.error(
            "message moved to dead letter",
            extra={"consumer": self.name, "subject": msg.subject, "error": error,
                   "deliveries": delivery.num_delivered},
        )
        try:
            await self._publisher.publish(subject, letter, msg_id)
        except Exception as err:
            # Keep the message: it is redelivered and dead-lettered again later.
            log.error("dead letter publish failed: %s", describe(err))
            await _quietly(msg.nak(delay=1.0))
            return
        metrics.DEAD_LETTERS.labels(self._service, self._label).inc()
        await _quietly(msg.term())
        self._finished(msg)


async def _quietly(awaitable: Awaitable[None]) -> None:
    try:
        await awaitable
    except Exception as err:  # an ack lost to a disconnect means a harmless redelivery
        log.debug("ack/nak failed: %s", describe(err))


async def _wait_either(stop: asyncio.Event, event: asyncio.Event, seconds: float) -> None:
    """Until ``stop`` or ``event`` is set, or ``seconds`` have passed."""
    waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(event.wait())]
    try:
        await asyncio.wait(waiters, timeout=max(seconds, 0.0), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except asyncio.TimeoutError:
        pass
