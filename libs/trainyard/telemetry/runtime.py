"""The process shell every service shares: health server, NATS session, Kubernetes client.

``/readyz`` is true only while the NATS connection is up and the API server answers; both are
re-checked continuously (NATS via the client's state, the API server by a ``/version`` probe
every couple of seconds).
"""
from __future__ import annotations

import asyncio
import logging
import sys

from trainyard.bus.session import BusSession
from trainyard.kube.client import KubeClient
from trainyard.telemetry import metrics
from trainyard.telemetry.health import HealthServer
from trainyard.telemetry.service import ServiceConfig

log = logging.getLogger(__name__)

# /readyz includes "the API server answers". While it does, one GET /version every 10 s (as
# often as a kubelet probes by default) is enough; while it does not, every 2 s, so that
# readiness comes back soon after the API server does. (Every 2 s throughout was one HTTPS
# request every 2 s from every replica to the API server, idle or not.)
API_PROBE_INTERVAL_S = 10.0
API_RETRY_INTERVAL_S = 2.0


class ServiceRuntime:
    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.health = HealthServer(config.http_host, config.http_port)
        self.bus: BusSession | None = None
        self.kube: KubeClient | None = None
        self._nats_up = False
        self._api_up = False
        self._tasks: list[asyncio.Task] = []
        self.health.add_check("nats", lambda: self._nats_up)
        self.health.add_check("apiserver", lambda: self._api_up)
        metrics.init_service_metrics(config.service)

    def add_check(self, name: str, check) -> None:
        self.health.add_check(name, check)

    async def start(self, stop: asyncio.Event) -> None:
        port = await self.health.start()
        log.info("http server listening", extra={"http_port": port, "http_host": self.config.http_host})
        print(f"trainyard {self.config.service}: listening on http://{self.config.http_host}:{port}",
              flush=True)
        sys.stdout.flush()
        self.kube = await KubeClient.from_kubeconfig(self.config.kubeconfig, self.config.context)
        self._tasks.append(asyncio.create_task(self._probe_api(stop)))
        self.bus = await BusSession.open(
            self.config.nats_url, f"trainyard-{self.config.service}",
            on_state=self._on_nats_state, stop=stop,
        )
        log.info("connected", extra={"nats_url": self.config.nats_url,
                                     "cluster": self.config.cluster})

    def _on_nats_state(self, connected: bool) -> None:
        self._nats_up = connected

    async def _probe_api(self, stop: asyncio.Event) -> None:
        assert self.kube is not None
        while not stop.is_set():
            up = await self.kube.ping()
            if up != self._api_up:
                log.info("api server %s", "reachable" if up else "unreachable")
            self._api_up = up
            try:
                await asyncio.wait_for(stop.wait(), timeout=API_PROBE_INTERVAL_S if up else API_RETRY_INTERVAL_S)
            except asyncio.TimeoutError:
                pass

    async def close(self) -> None:
        self.health.live = False
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.bus is not None:
            await self.bus.close()
        if self.kube is not None:
            await self.kube.close()
        await self.health.stop()
        log.info("stopped")
