"""The dashboard's HTTP side (FastAPI): the page and its assets (the charting library,
plotly.js, is served from the installed ``plotly`` wheel), a JSON snapshot, the server-sent
events stream, one TrainJob's detail (timeline, pods, recent log lines) and progress history,
and the usual ``/healthz``, ``/readyz``, ``/metrics``."""
from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from trainyard.errortext import describe
from trainyard.kube.client import KubeClient, KubeError
from trainyard_services.dashboard.live import Live

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"


def plotly_js() -> Path:
    """plotly.js as the installed ``plotly`` package ships it (a pinned dependency). Found, not
    imported: importing the Python package costs about 0.7 s and the dashboard needs the file only."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the plotly package is not installed (a trainyard dependency: reinstall trainyard)")
    bundle = Path(list(spec.submodule_search_locations)[0]) / "package_data" / "plotly.min.js"
    if not bundle.is_file():
        raise RuntimeError(f"plotly.js not found at {bundle} (reinstall the plotly package)")
    return bundle


HEARTBEAT_S = 15.0
LOG_LINES = 20
MAX_PODS = 8


def sse(kind: str, data: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def build_app(live: Live, kube_for: Callable[[str], KubeClient | None], ready: Callable[[], bool]) -> FastAPI:
    app = FastAPI(title="trainyard dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/")
    async def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    charting = plotly_js()

    @app.get("/vendor/plotly.min.js")
    async def plotly_bundle() -> FileResponse:
        # FileResponse sends an ETag and Last-Modified: a reload revalidates instead of
        # downloading the 4.8 MB bundle again.
        return FileResponse(charting, media_type="text/javascript", headers={"Cache-Control": "no-cache"})

    @app.get("/healthz")
    async def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok\n")

    @app.get("/readyz")
    async def readyz() -> PlainTextResponse:
        return PlainTextResponse("ok\n") if ready() else PlainTextResponse("not ready: nats\n", status_code=503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/api/snapshot")
    async def snapshot() -> JSONResponse:
        return JSONResponse(await live.fresh_snapshot())

    @app.get("/api/events")
    async def events() -> StreamingResponse:
        queue = live.listen()

        async def stream() -> AsyncIterator[bytes]:
            try:
                yield sse("snapshot", await live.fresh_snapshot())
                while True:
                    try:
                        kind, data = await asyncio.wait_for(queue.get(), timeout=HEARTBEAT_S)
                    except asyncio.TimeoutError:
                        yield b": heartbeat\n\n"
                        continue
                    yield sse(kind, data)
            finally:
                live.forget(queue)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.get("/api/trainjobs/{cluster}/{namespace}/{name}")
    async def detail(cluster: str, namespace: str, name: str) -> JSONResponse:
        row = live.rows.get(f"{cluster}/{namespace}/{name}")
        if row is None:
            raise HTTPException(404, f"TrainJob {namespace}/{name} not known in cluster {cluster}")
        kube = kube_for(cluster)
        pods: list[dict[str, Any]] = []
        if kube is not None:
            pods = await pods_of(kube, namespace, name)
        return JSONResponse({"trainjob": row, "pods": pods})

    @app.get("/api/trainjobs/{cluster}/{namespace}/{name}/progress")
    async def progress(cluster: str, namespace: str, name: str) -> JSONResponse:
        try:
            history = await live.progress(cluster, namespace, name)
        except Exception as err:  # noqa: BLE001 - the bus is away or refused: say so, keep serving
            log.warning("progress history of %s/%s/%s unreadable: %s", cluster, namespace, name, describe(err))
            raise HTTPException(503, f"progress history of TrainJob {namespace}/{name} unreadable: "
                                     f"{describe(err)}") from None
        if history is None:
            raise HTTPException(404, f"TrainJob {namespace}/{name} not known in cluster {cluster}")
        return JSONResponse(history)

    return app


async def pods_of(kube: KubeClient, namespace: str, name: str) -> list[dict[str, Any]]:
    """The JobSet's pods (upstream's label), each with its phase and last log lines."""
    try:
        listed = await kube.request("GET", f"/api/v1/namespaces/{namespace}/pods",
                                    query={"labelSelector": f"jobset.sigs.k8s.io/jobset-name={name}"},
                                    timeout_s=5.0)
    except KubeError as err:
        log.debug("listing pods of %s/%s failed: %s", namespace, name, describe(err))
        return []
    items = sorted(listed.get("items") or [], key=lambda p: p["metadata"]["name"])[:MAX_PODS]

    async def describe(pod: dict[str, Any]) -> dict[str, Any]:
        containers = (pod.get("spec") or {}).get("containers") or [{}]
        try:
            text = await kube.pod_log(namespace, pod["metadata"]["name"], container=containers[0].get("name"),
                                      tail_lines=LOG_LINES, timeout_s=5.0)
        except KubeError:
            text = ""
        return {"name": pod["metadata"]["name"], "phase": (pod.get("status") or {}).get("phase", ""),
                "node": ((pod.get("metadata") or {}).get("labels") or {}).get(
                    "batch.kubernetes.io/job-completion-index", ""),
                "log": text.splitlines()[-LOG_LINES:]}

    return list(await asyncio.gather(*(describe(pod) for pod in items)))
