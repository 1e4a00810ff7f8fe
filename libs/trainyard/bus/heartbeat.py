"""A replica's heartbeat, written from a thread of its own over a NATS connection of its own.

A partitioned replica keeps its leases by rewriting its entry in ``ty_members`` every second
(trainyard.bus.partitions; the entry lapses 3 s after its last write). Written from the event
loop, the heartbeat waits behind every ready task: a replica at its CPU limit (a pod's
``resources.limits.cpu``) with a backlog wrote it more than 2.5 s late and lost its partitions
mid-work (bench/e2e.py --cpu-limit 0.03, issue #33). From a thread, it needs only the GIL for a
moment: the interpreter hands it over within its switch interval (5 ms of the other thread's CPU).

A heartbeat must still mean the replica works: the writer beats only while ``alive()`` says the
event loop made progress recently (trainyard.bus.partitions.HEARTBEAT_STALL_S), so a replica
whose loop hangs loses its leases as before. The writer never touches the main loop's connection or state.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Callable

from trainyard.errortext import describe
from trainyard.telemetry import metrics

log = logging.getLogger(__name__)


class HeartbeatWriter:
    """Writes ``value`` to ``key`` of KV bucket ``bucket`` every ``interval_s`` while ``alive()``."""

    def __init__(self, url: str, connection_name: str, bucket: str, key: str, value: bytes, *,
                 interval_s: float, alive: Callable[[], bool], role: str) -> None:
        self.url, self.connection_name = url, connection_name
        self.bucket, self.key, self.value = bucket, key, value
        self.interval_s = interval_s
        self.alive = alive
        self.role = role
        self.last_write = 0.0  # monotonic time of the last write that the server took
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"heartbeat-{role}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stops writing (the entry is then left to the caller: deleted, or left to lapse)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def fresh(self) -> bool:
        """Whether the last write is recent (else the caller writes the heartbeat itself)."""
        return time.monotonic() - self.last_write < 1.5 * self.interval_s

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except Exception as err:  # noqa: BLE001 - the event loop's own heartbeat takes over
            log.warning("heartbeat writer of %s stopped: %s", self.role, describe(err))

    async def _run(self) -> None:
        from trainyard.bus.connection import connect

        nc = None
        try:
            while not self._stop.is_set():
                try:
                    if nc is None:
                        nc = await connect(self.url, self.connection_name, connect_timeout_s=2.0)
                    kv = await nc.jetstream().key_value(self.bucket)
                    break
                except Exception as err:  # noqa: BLE001 - NATS away or the bucket not made yet
                    log.debug("heartbeat writer of %s not connected: %s", self.role, describe(err))
                    await asyncio.sleep(min(self.interval_s, 1.0))
            else:
                return
            while not self._stop.is_set():
                now = time.monotonic()
                if self.alive():
                    try:
                        await kv.put(self.key, self.value)
                        if self.last_write:
                            metrics.HEARTBEAT_INTERVAL.labels(self.role).observe(now - self.last_write)
                        self.last_write = now
                    except Exception as err:  # noqa: BLE001 - the lease may lapse; retried next beat
                        log.debug("heartbeat of %s not written: %s", self.role, describe(err))
                await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - now)))
        finally:
            if nc is not None:
                try:
                    await nc.close()
                except Exception:  # noqa: BLE001 - closing on the way out
                    pass
