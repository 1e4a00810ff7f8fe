"""A replica's presence: a JetStream consumer that lives as long as the replica's connection.

A partitioned replica (trainyard.bus.partitions) is live while its presence is. The presence is
an ephemeral push consumer on the ``ty_members`` bucket's stream, named after the role, the
cluster and the replica, delivering to a subject of the replica's inbox that nothing is ever
published to. nats-server deletes such a consumer ``inactive_threshold`` (LEASE_TTL_S) after the
last subscription on its delivery subject went away: the replica's connection closed (a crash,
SIGKILL, a node lost) or the replica withdrew it. Every deletion and creation is announced on
``$JS.EVENT.ADVISORY.CONSUMER.{DELETED,CREATED}.KV_ty_members.*``, so the other replicas learn
of a join or a loss when it happens, and the live replicas are one listing of consumer names.

A replica that is alive therefore writes nothing and reads nothing per second (it used to
rewrite a heartbeat every second and read the role's heartbeats every second: about 2 ms of
CPU a second per replica and most of nats-server's idle work, issue #33).

The consumer is kept from a thread with a NATS connection of its own, as the heartbeat was: a
replica at its CPU limit with a backlog keeps its presence however late its event loop runs.
It must still mean the replica works: every ``check_s`` the thread posts a probe to the event
loop; when the loop has not run a probe for ``stall_s`` (a hung loop), the presence is
withdrawn, and made again once the loop runs.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import threading
import time
from typing import Any, Callable

from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from trainyard.bus.subjects import encode_token
from trainyard.bus.topology import LEASE_TTL_S, MEMBERS_BUCKET, PRESENCE_ADVISORIES as ADVISORIES, PRESENCE_STREAM
from trainyard.errortext import describe
from trainyard.telemetry import metrics

log = logging.getLogger(__name__)

_SAFE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def presence_prefix(role: str, cluster: str) -> str:
    """The start of every presence name of ``role`` on ``cluster``: consumer names cannot hold
    every character a role or cluster name can, so the pair is hashed."""
    digest = hashlib.blake2b(f"{role}/{cluster}".encode(), digest_size=6).hexdigest()
    return f"m-{digest}-"


def presence_name(role: str, cluster: str, replica: str) -> str:
    """The presence consumer's name: the prefix, then the replica (``r`` + itself when it is a
    plain name, else ``h`` + its UTF-8 in hex), so the listing gives the replica back."""
    token = f"r{replica}" if _SAFE.fullmatch(replica) else "h" + replica.encode().hex()
    return presence_prefix(role, cluster) + token


def replica_of(name: str, prefix: str) -> str | None:
    """The replica a presence name stands for, or None when it is not one of ``prefix``'s."""
    if not name.startswith(prefix):
        return None
    token = name[len(prefix):]
    if token.startswith("r") and len(token) > 1:
        return token[1:]
    if token.startswith("h"):
        try:
            return bytes.fromhex(token[1:]).decode()
        except ValueError:
            return None
    return None


def presence_filter(role: str, cluster: str, replica: str) -> str:
    """The subject the consumer filters on: the replica's own key of ``ty_members`` (its grants
    allow consumers on its role's keys only; nothing writes that key)."""
    return f"$KV.{MEMBERS_BUCKET}.{encode_token(role)}.{encode_token(cluster)}.m.{encode_token(replica)}"


async def live_replicas(nc: Any, role: str, cluster: str, timeout_s: float = 2.0) -> list[str]:
    """The replicas of ``role`` on ``cluster`` whose presence exists: one request per 1,024
    presences of the whole bus (every role and cluster)."""
    prefix = presence_prefix(role, cluster)
    found: list[str] = []
    offset = 0
    while True:
        reply = await nc.request(f"$JS.API.CONSUMER.NAMES.{PRESENCE_STREAM}", json.dumps({"offset": offset}).encode(),
                                 timeout=timeout_s)
        body = json.loads(reply.data)
        if "error" in body:
            raise RuntimeError(f"listing presences: {body['error'].get('description', body['error'])}")
        names = body.get("consumers") or []
        found += [replica for replica in (replica_of(name, prefix) for name in names) if replica is not None]
        offset += len(names)
        if not names or offset >= int(body.get("total", 0)):
            return sorted(set(found))


class Presence:
    """Keeps ``replica``'s presence from a thread of its own while the event loop runs."""

    def __init__(self, url: str, connection_name: str, role: str, cluster: str, replica: str, *,
                 check_s: float, stall_s: float, on_change: Callable[[], None] | None = None) -> None:
        self.url, self.connection_name = url, connection_name
        self.role, self.cluster, self.replica = role, cluster, replica
        self.name = presence_name(role, cluster, replica)
        self.check_s, self.stall_s = check_s, stall_s
        self.on_change = on_change  # called on the event loop when the presence was made again
        self.generation = 0  # how many times the presence was made (read by the event loop)
        self.registered = threading.Event()
        self._failures = 0  # registrations failed in a row
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._refresh = threading.Event()
        self._probed = threading.Event()
        self._wakeup: asyncio.Event | None = None  # the thread's own loop's
        self._thread_loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._main, name=f"presence-{role}", daemon=True)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread.start()

    async def wait_registered(self, stop: asyncio.Event) -> bool:
        """Waits until the presence exists (True) or ``stop`` (False); says every 10 s that it
        still waits (the replica takes no partition meanwhile)."""
        started = warned = time.monotonic()
        while not stop.is_set():
            if self.registered.is_set():
                return True
            if time.monotonic() - warned >= 10.0:
                warned = time.monotonic()
                log.warning("presence of %s not made after %.0f s; no partition is taken until it is",
                            self.role, warned - started)
            try:
                await asyncio.wait_for(stop.wait(), timeout=0.05)
            except asyncio.TimeoutError:
                pass
        return False

    def refresh(self) -> None:
        """Asks the thread to make the presence again if it is gone (the event loop's listing
        lacks it: a restart of nats-server forgot it)."""
        self._refresh.set()
        self._nudge()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Withdraws the presence (deletes the consumer) and ends the thread."""
        self._stop.set()
        self._nudge()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _nudge(self) -> None:
        loop, wakeup = self._thread_loop, self._wakeup
        if loop is not None and wakeup is not None:
            try:
                loop.call_soon_threadsafe(wakeup.set)
            except RuntimeError:  # the thread's loop has ended
                pass

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except Exception as err:  # noqa: BLE001 - the partitions lapse; the replica logs it
            log.warning("presence of %s stopped: %s", self.role, describe(err))

    async def _run(self) -> None:
        from trainyard.bus.connection import connect

        self._thread_loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        reconnected = threading.Event()

        def on_state(connected: bool) -> None:  # (on this thread's loop)
            if connected:
                reconnected.set()  # made again at once: a restarted nats-server forgot it
                self._wakeup.set()

        nc = None
        while nc is None and not self._stop.is_set():
            try:
                nc = await connect(self.url, self.connection_name, connect_timeout_s=2.0, on_state=on_state)
            except Exception as err:  # noqa: BLE001 - NATS away: try again
                log.debug("presence of %s not connected: %s", self.role, describe(err))
                await self._pause(min(self.check_s, 1.0))
        if nc is None:
            return
        reconnected.clear()
        deliver = nc.new_inbox()
        try:
            await nc.subscribe(deliver)  # the interest that keeps the consumer
            js = nc.jetstream()
            present = False
            stalled_since: float | None = None
            while not self._stop.is_set():
                now = time.monotonic()
                # The event loop's liveness: did it run the probe posted last time?
                if self._probed.is_set() or stalled_since is None:
                    stalled_since = now
                    self._probed.clear()
                    self._post_probe()
                alive = now - stalled_since < self.stall_s
                if present and not alive:
                    log.warning("event loop of %s stalled for %.0f s: presence withdrawn", self.role,
                                now - stalled_since)
                    metrics.PRESENCE_WITHDRAWN.labels(self.role).inc()
                    present = not await self._withdraw(js)
                elif alive and (not present or reconnected.is_set() or self._refresh.is_set()):
                    reconnected.clear()
                    self._refresh.clear()
                    present = await self._register(js, deliver)
                await self._pause(self.check_s if present else min(self.check_s, 0.5))
            await self._withdraw(js)
        finally:
            try:
                await nc.close()
            except Exception:  # noqa: BLE001 - closing on the way out
                pass

    def _post_probe(self) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._probed.set)
        except RuntimeError:  # the event loop has closed: the replica is going away
            pass

    async def _pause(self, seconds: float) -> None:
        assert self._wakeup is not None
        try:
            await asyncio.wait_for(self._wakeup.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            pass
        self._wakeup.clear()

    async def _register(self, js: Any, deliver: str) -> bool:
        """Creates the consumer (a no-op when it exists as it is); True when it exists."""
        try:
            stream = await js.stream_info(PRESENCE_STREAM)
            await js.add_consumer(PRESENCE_STREAM, ConsumerConfig(
                name=self.name, deliver_subject=deliver,
                filter_subject=presence_filter(self.role, self.cluster, self.replica),
                deliver_policy=DeliverPolicy.NEW, ack_policy=AckPolicy.NONE,
                inactive_threshold=LEASE_TTL_S, mem_storage=True,
                # As many copies as the stream: a presence must outlive the loss of one NATS node
                # (an ephemeral consumer is otherwise one copy, and one on a lost node would stay
                # listed with nothing left to delete it).
                num_replicas=stream.config.num_replicas or 1,
                description=f"presence of {self.role} replica {self.replica} on {self.cluster}"))
        except Exception as err:  # noqa: BLE001 - NATS away: retried at the next check
            self._failures += 1
            (log.warning if self._failures % 20 == 1 else log.debug)(
                "presence of %s not made (%d tries): %s", self.role, self._failures, describe(err))
            return False
        self._failures = 0
        self.generation += 1
        self.registered.set()
        if self.on_change is not None and self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self.on_change)
            except RuntimeError:
                pass
        return True

    async def _withdraw(self, js: Any) -> bool:
        """Deletes the consumer; True when it is gone."""
        self.registered.clear()
        try:
            await js.delete_consumer(PRESENCE_STREAM, self.name)
        except Exception as err:  # noqa: BLE001 - gone already, or NATS away (it lapses then)
            log.debug("presence of %s not deleted: %s", self.role, describe(err))
            return "not found" in describe(err).lower()
        return True
