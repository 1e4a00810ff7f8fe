"""The trainer status endpoint (v2.3.0 TrainJobStatus): trainer pods POST their progress here
over HTTPS with a projected ServiceAccount token; verified against the cluster issuer's keys
(OIDC discovery and JWKS, read through the API server), it is written to the TrainJob's
``status.trainerStatus`` by server-side apply (field manager ``trainer-status``).

Decisions are ``trainyard.pipeline.trainer_status``; this module is the HTTP and API plumbing.
Answers are ``metav1.Status`` bodies as upstream's: 403 ``Forbidden``, 422 ``Invalid payload``
or the API server's own validation message, 404 ``Train job not found``, 413 ``Payload too
large``; 200 echoes the report.

Each accepted report is also kept on the bus (``trainyard.bus.progress``: the TrainJob's progress
history, which the dashboard charts); a report the bus could not take is still answered 200,
since the TrainJob's status has it.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import contextmanager
from typing import Any, Awaitable, Callable, Iterator

from aiohttp import web

from trainyard.apimachinery import serviceaccount_tokens as sat
from trainyard.errortext import describe
from trainyard.kube.client import KubeClient, KubeError
from trainyard.kube.resources import TRAINJOB
from trainyard.pipeline import trainer_status as ts
from trainyard.telemetry import metrics

log = logging.getLogger(__name__)

# A key set is re-read at most this often when a token names a key it does not hold (rotation).
KEYS_REFRESH_MIN_S = 30.0
# Every report waits behind a key refresh (the lock), and a trainer gives up on its report after a
# few seconds (the SDK's and the examples' clients): neither read may hang for the client's 30 s.
KEYS_READ_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 10.0
SLOW_ANSWER_S = 1.0


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code}
    return web.json_response(body, status=code)


class IssuerKeys:
    """The cluster issuer and its key set, read through the API server and cached."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self.issuer = ""
        self.keys: dict[str, Any] = {"keys": []}
        self._read_at = 0.0
        self._lock = asyncio.Lock()

    async def refresh(self, *, force: bool = False) -> None:
        async with self._lock:
            if not force and self.issuer and time.monotonic() - self._read_at < KEYS_REFRESH_MIN_S:
                return
            discovery = await self.client.request("GET", sat.DISCOVERY_PATH, timeout_s=KEYS_READ_TIMEOUT_S)
            issuer = str(discovery["issuer"])
            jwks_uri = str(discovery["jwks_uri"])
            # The key set is served by the API server itself: read it with the same client.
            path = jwks_uri[len(issuer.rstrip("/")):] if jwks_uri.startswith(issuer.rstrip("/")) else sat.JWKS_PATH
            self.keys = await self.client.request("GET", path, timeout_s=KEYS_READ_TIMEOUT_S)
            self.issuer = issuer
            self._read_at = time.monotonic()

    async def authorized(self, header: str | None, namespace: str, name: str) -> bool:
        if not self.issuer:
            await self.refresh(force=True)
        if ts.authorized(header, namespace, name, self.keys, issuer=self.issuer, now=int(time.time())):
            return True
        token = ts.bearer_token(header)
        known = {k.get("kid") for k in self.keys.get("keys") or []}
        if token and _kid(token) not in known:
            await self.refresh()  # a new signing key, perhaps
            return ts.authorized(header, namespace, name, self.keys, issuer=self.issuer, now=int(time.time()))
        return False


class _Stages:
    """Where one report's answer time went: each stage into the stage histogram, and a report
    answered slower than SLOW_ANSWER_S logged with its stages, so the cause has a name."""

    def __init__(self) -> None:
        self.began = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = time.perf_counter() - began
            metrics.TRAINER_STATUS_STAGE.labels(stage).observe(self.seconds[stage])

    def done(self, request: web.Request, code: int) -> None:
        total = time.perf_counter() - self.began
        metrics.TRAINER_STATUS_STAGE.labels("total").observe(total)
        metrics.TRAINER_STATUS_REPORTS.labels(str(code)).inc()
        if total > SLOW_ANSWER_S:
            # The rest (total minus the stages) is time the event loop was busy elsewhere.
            rest = total - sum(self.seconds.values())
            log.warning("progress report of %s/%s answered %d after %.2f s: %s, the rest %.2f s "
                        "(the body, a busy event loop)",
                        request.match_info.get("namespace"), request.match_info.get("name"), code, total,
                        ", ".join(f"{stage} {seconds:.2f} s" for stage, seconds in self.seconds.items()) or "-",
                        rest)


def _kid(token: str) -> str | None:
    try:
        return sat.unverified_header(token).get("kid")
    except sat.TokenError:
        return None


# Called with the TrainJob the API server answered a report's write with.
OnReport = Callable[[dict[str, Any]], Awaitable[None]]


def make_app(client: KubeClient, keys: IssuerKeys | None = None, on_report: OnReport | None = None) -> web.Application:
    keys = keys or IssuerKeys(client)

    async def report(request: web.Request) -> web.Response:
        stages = _Stages()
        answer = await _answer(request, stages)
        stages.done(request, answer.status)
        return answer

    async def _answer(request: web.Request, stages: "_Stages") -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        if request.content_length is not None and request.content_length > ts.MAX_BODY_BYTES:
            return _status(413, "RequestEntityTooLarge", "Payload too large")
        try:
            with stages.timed("verify"):
                allowed = await keys.authorized(request.headers.get("Authorization"), namespace, name)
        except (KubeError, KeyError, ValueError) as err:
            log.warning("cannot read the issuer's keys: %s", describe(err))
            return _status(500, "InternalError", "Internal error")
        if not allowed:
            return _status(403, "Forbidden", "Forbidden")
        raw = await request.content.read(ts.MAX_BODY_BYTES + 1)
        if len(raw) > ts.MAX_BODY_BYTES:
            return _status(413, "RequestEntityTooLarge", "Payload too large")
        try:
            body = json.loads(raw)
            apply = ts.status_apply(namespace, name, body)
        except (ValueError, ts.InvalidPayload):
            return _status(422, "Invalid", "Invalid payload")
        if apply is not None:
            try:
                with stages.timed("write"):
                    written = await client.request("PATCH", TRAINJOB.path(namespace, name, "status"),
                                                   query={"fieldManager": ts.FIELD_MANAGER, "force": "true"},
                                                   body=apply, content_type="application/apply-patch+yaml",
                                                   timeout_s=WRITE_TIMEOUT_S)
            except KubeError as err:
                if err.status in (400, 422):
                    return _status(422, "Invalid", err.message or f"Validation failed: {err}")
                if err.not_found:
                    return _status(404, "NotFound", "Train job not found")
                log.error("status write of %s/%s failed: %s", namespace, name, describe(err))
                return _status(500, "InternalError", "Internal error")
            if on_report is not None and isinstance(written, dict):
                with stages.timed("history"):
                    await on_report(written)
        return web.json_response(body)

    async def other(_: web.Request) -> web.Response:
        return _status(404, "NotFound", "Not found")

    app = web.Application(client_max_size=ts.MAX_BODY_BYTES + 1024)
    app.router.add_post(ts.status_path("{namespace}", "{name}"), report)
    app.router.add_route("*", "/{tail:.*}", other)
    return app


def history_recorder(publisher: Any, cluster: str, timeout_s: float = 2.0) -> OnReport:
    """Publishes each accepted report to the progress history (bounded wait: a trainer's report
    is never held up long by the bus; a missed point is logged, not retried)."""
    from trainyard.bus.progress import publish_report, report_of

    async def record(written: dict[str, Any]) -> None:
        try:
            await asyncio.wait_for(publish_report(publisher, report_of(cluster, written, time.time())), timeout_s)
        except Exception as err:  # noqa: BLE001 - the status write happened; only the chart misses a point
            meta = written.get("metadata") or {}
            log.warning("progress report of %s/%s not kept on the bus: %s", meta.get("namespace"), meta.get("name"),
                        describe(err))

    return record


async def serve(client: KubeClient, host: str, port: int, cert_dir: str,
                on_report: OnReport | None = None) -> web.AppRunner:
    """Serve the endpoint over HTTPS with ``<cert_dir>/tls.crt`` and ``tls.key``; the caller
    cleans the returned runner up."""
    import ssl
    from pathlib import Path

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(Path(cert_dir) / "tls.crt", Path(cert_dir) / "tls.key")
    runner = web.AppRunner(make_app(client, on_report=on_report), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=context).start()
    log.info("trainer status endpoint listening", extra={"host": host, "port": port})
    return runner
