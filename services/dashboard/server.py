"""The dashboard process: NATS session, a Kubernetes client per cluster, uvicorn."""
from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path

import uvicorn

from trainyard.bus.session import BusSession
from trainyard.errortext import describe
from trainyard.kube.client import KubeClient
from trainyard.host.asgi_server import QuietServer
from trainyard.host.service import ServiceConfig
from trainyard_services.dashboard.app import build_app
from trainyard_services.dashboard.live import Live

log = logging.getLogger(__name__)


def kubeconfigs(config: ServiceConfig, clusters: list[str], stack_state: Path | None) -> dict[str, str | None]:
    """Each cluster's kubeconfig: from stack.json when the stack lists several, else --kubeconfig."""
    listed: dict[str, dict[str, str]] = {}
    if stack_state is not None:
        try:
            listed = json.loads(stack_state.read_text()).get("clusters") or {}
        except (OSError, ValueError):
            listed = {}
    return {cluster: (listed.get(cluster) or {}).get("kubeconfig") or config.kubeconfig for cluster in clusters}


async def serve(config: ServiceConfig, clusters: list[str], stack_state: Path | None, stop: asyncio.Event) -> None:
    state = {"nats": False}
    bus = await BusSession.open(config.nats_url, "trainyard-dashboard",
                                on_state=lambda up: state.__setitem__("nats", up), stop=stop)
    state["nats"] = True
    kubes: dict[str, KubeClient] = {}
    for cluster, path in kubeconfigs(config, clusters, stack_state).items():
        try:
            kubes[cluster] = await KubeClient.from_kubeconfig(path)
        except Exception as err:  # noqa: BLE001 - pods and logs are then not shown for it
            log.warning("no Kubernetes client for cluster %s: %s", cluster, describe(err))
    live = Live(bus, clusters, stack_state)
    await live.start()
    app = build_app(live, kubes.get, lambda: state["nats"])
    server = QuietServer(uvicorn.Config(app, host=config.http_host, port=config.http_port, log_config=None,
                                           access_log=False, lifespan="off", timeout_graceful_shutdown=2))
    serving = asyncio.create_task(server.serve())
    services = asyncio.gather(live.watch_services(stop), live.watch_stack(stop),
                              live.watch_workers(stop, kubes.get))
    try:
        while not server.started:
            if serving.done():
                serving.result()
                return
            await asyncio.sleep(0.05)
        port = server.servers[0].sockets[0].getsockname()[1]
        log.info("dashboard listening", extra={"http_port": port, "clusters": clusters})
        print(f"trainyard dashboard: listening on http://{config.http_host}:{port}", flush=True)
        sys.stdout.flush()
        await asyncio.wait({serving, asyncio.ensure_future(stop.wait())}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        server.should_exit = True
        services.cancel()
        await asyncio.gather(serving, services, return_exceptions=True)
        await live.stop()
        for kube in kubes.values():
            await kube.close()
        await bus.close()
        log.info("stopped")
