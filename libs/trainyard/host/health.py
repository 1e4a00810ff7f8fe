"""The small HTTP server every service runs: ``/healthz``, ``/readyz``, ``/metrics``.

``/readyz`` answers 200 only when every readiness check passes (e.g. connected to NATS and
the API server); otherwise 503 with the failing checks listed, one per line.

Before answering ``/metrics`` it runs the refreshes registered with
:func:`trainyard.telemetry.scrape.on_scrape`.
"""
from __future__ import annotations

import inspect
import logging
from typing import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from trainyard.telemetry.scrape import refresh_metrics

log = logging.getLogger(__name__)

ReadinessCheck = Callable[[], "bool | Awaitable[bool]"]  # a check that must ask something is a coroutine


class HealthServer:
    def __init__(self, host: str, port: int) -> None:
        self._host = host
        self._port = port
        self._checks: dict[str, ReadinessCheck] = {}
        self._runner: web.AppRunner | None = None
        self.bound_port: int | None = None
        self.live = True

    def add_check(self, name: str, check: ReadinessCheck) -> None:
        self._checks[name] = check

    async def failing_checks(self) -> list[str]:
        failing = []
        for name, check in self._checks.items():
            result = check()
            if not (await result if inspect.isawaitable(result) else result):
                failing.append(name)
        return failing

    async def start(self) -> int:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        server = site._server  # the bound socket tells the real port when 0 was asked for
        self.bound_port = server.sockets[0].getsockname()[1] if server and server.sockets else self._port
        return self.bound_port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n" if self.live else "stopping\n", status=200 if self.live else 503)

    async def _readyz(self, _: web.Request) -> web.Response:
        failing = await self.failing_checks()
        if failing:
            return web.Response(text="".join(f"not ready: {name}\n" for name in failing), status=503)
        return web.Response(text="ok\n")

    async def _metrics(self, _: web.Request) -> web.Response:
        await refresh_metrics()
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})
