"""The process shell every service shares: health server, NATS session, Kubernetes client.

``/readyz`` is true only while the NATS connection is up and the API server answers: NATS by
the client's state, the API server by a ``/version`` probe made when readiness is asked (a
kubelet's readinessProbe, the supervisor), not on a timer.
"""
from __future__ import annotations

import asyncio
import logging
import sys

from trainyard.bus.session import BusSession
from trainyard.kube.client import KubeClient
from trainyard.telemetry import metrics
from trainyard.host.health import HealthServer
from trainyard.host.service import ServiceConfig

log = logging.getLogger(__name__)

# /readyz includes "the API server answers", probed when /readyz is asked. A probe's answer is
# kept for API_PROBE_INTERVAL_S while the API server answered (a kubelet asks every 10 s by
# default), API_RETRY_INTERVAL_S while it did not. (A probe every 10 s on a timer, answered or
# not asked for, was one HTTPS request every 10 s from every idle replica: about a tenth of an
# idle status replica's CPU.)
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
        self._api_probed = float("-inf")  # loop time of the last probe's answer
        self._api_lock = asyncio.Lock()  # readiness asked twice at once waits for one probe
        self._tasks: list[asyncio.Task] = []
        self.health.add_check("nats", lambda: self._nats_up)
        self.health.add_check("apiserver", self._api_ready)
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
        self.bus = await BusSession.open(
            self.config.nats_url, f"trainyard-{self.config.service}",
            on_state=self._on_nats_state, stop=stop,
        )
        log.info("connected", extra={"nats_url": self.config.nats_url,
                                     "cluster": self.config.cluster})

    def _on_nats_state(self, connected: bool) -> None:
        self._nats_up = connected

    async def _api_ready(self) -> bool:
        """Whether the API server answers: the last probe's answer while it is fresh, else a
        new probe (concurrent asks share it)."""
        if self.kube is None:
            return False
        async with self._api_lock:
            fresh_for = API_PROBE_INTERVAL_S if self._api_up else API_RETRY_INTERVAL_S
            if asyncio.get_running_loop().time() - self._api_probed < fresh_for:
                return self._api_up
            return await self._probe_api()

    async def _probe_api(self) -> bool:
        assert self.kube is not None
        up = await self.kube.ping()
        if up != self._api_up:
            log.info("api server %s", "reachable" if up else "unreachable")
        self._api_up, self._api_probed = up, asyncio.get_running_loop().time()
        return up

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
