"""One service's handle on the bus: connection, JetStream, topology, publisher and stores."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Callable

from nats.aio.client import Client
from nats.js import JetStreamContext

from trainyard.bus.auth import from_environment
from trainyard.bus.connection import ServerTooOld, connect
from trainyard.bus.kv import AppliedPlanStore, OutcomeStore, SnapshotStore
from trainyard.bus.publisher import Publisher
from trainyard.bus.topology import ensure_topology
from trainyard.errortext import describe

log = logging.getLogger(__name__)


def may_create_topology() -> bool:
    """On an unauthenticated bus every service ensures the topology; with credentials only the
    bootstrap identity does (the others wait for it: their grants cannot create streams)."""
    credentials = from_environment()
    return credentials is None or credentials.topology


@dataclass
class BusSession:
    nc: Client
    js: JetStreamContext
    publisher: Publisher
    snapshots: SnapshotStore
    applied: AppliedPlanStore
    outcomes: OutcomeStore
    # Where and as whom it connected: a replica's presence opens a connection of its own.
    url: str = ""
    name: str = ""

    @classmethod
    async def open(
        cls,
        url: str,
        service: str,
        *,
        on_state: Callable[[bool], None] | None = None,
        stop: asyncio.Event | None = None,
    ) -> "BusSession":
        """Connects, sets up topology and opens the KV stores, retrying until all succeed or
        ``stop`` is set (a NATS server that is starting or recovering JetStream answers late, and
        a node of a NATS cluster may go away meanwhile: the client moves to another)."""
        attempt = 0
        nc: Client | None = None
        while True:
            try:
                if nc is None:
                    nc = await connect(url, service, on_state=on_state)
                js = nc.jetstream(publish_async_max_pending=4000)
                if may_create_topology():
                    await ensure_topology(js)
                stores = (await SnapshotStore.open(js), await AppliedPlanStore.open(js), await OutcomeStore.open(js))
                break
            except ServerTooOld:
                raise  # no retry makes an old server new
            except Exception as err:
                attempt += 1
                if stop is not None and stop.is_set():
                    if nc is not None:
                        await nc.close()
                    raise
                log.warning("nats not ready yet (%s); retrying", describe(err),
                            extra={"nats_url": url})
                await asyncio.sleep(min(0.2 * attempt, 2.0))
        return cls(
            nc=nc,
            js=js,
            publisher=Publisher(js, service),
            snapshots=stores[0],
            applied=stores[1],
            outcomes=stores[2],
            url=url,
            name=service,
        )

    async def close(self) -> None:
        try:
            await self.nc.drain()
        except Exception:
            await self.nc.close()
