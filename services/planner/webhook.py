"""The validating admission webhooks (TrainJob, TrainingRuntime, ClusterTrainingRuntime).

aiohttp's server over HTTPS (aiohttp is already the health server's and the kube client's
library): an admission is one POST of JSON in and out, through two small middlewares (metrics;
a server span when spans leave the process) and its handler. FastAPI and uvicorn, which served
it before, were imported by every planner start for nothing else (issue #33).
The verdict comes from the pipeline's validation (spec §6); the objects the
rules read (runtime, existing JobSet, PriorityClasses) come from the KV snapshots, like
upstream's informer cache, with a direct GET when a runtime is not there yet.
"""
from __future__ import annotations

import base64
import json
import logging
import os
import socket
import ssl
import tempfile
import time
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable

from aiohttp import web

from trainyard.pipeline.errors import aggregate_message
from trainyard.compat import DEFAULT_COMPAT, TrainerCompat
from trainyard.pipeline.defaulting import (DEFAULTER_CONFIGURATION, DEFAULTER_PATH, DEFAULTER_WEBHOOK,
                                          runtime_patch_times)
from trainyard.pipeline.validation import (ValidationResult, validate_runtime, validate_trainjob,
                                          validate_trainjob_scale)
from trainyard.telemetry import metrics

log = logging.getLogger(__name__)

CONFIGURATION_NAME = "validator.trainer.kubeflow.org"
GROUP = "trainer.kubeflow.org"
WEBHOOKS = (
    ("validator.clustertrainingruntime.trainer.kubeflow.org",
     "/validate-trainer-kubeflow-org-v1alpha1-clustertrainingruntime", "clustertrainingruntimes"),
    ("validator.trainingruntime.trainer.kubeflow.org",
     "/validate-trainer-kubeflow-org-v1alpha1-trainingruntime", "trainingruntimes"),
    ("validator.trainjob.trainer.kubeflow.org",
     "/validate-trainer-kubeflow-org-v1alpha1-trainjob", "trainjobs"),
)

# The objects the TrainJob rules read; ``jobset=False``: without the existing JobSet (only the
# rules of an update read it).
ObservedLookup = Callable[..., Awaitable[list[dict[str, Any]]]]
# (namespace, name) -> the TrainJob, for ``trainjobs/scale`` requests (they carry Scale objects).
TrainJobLookup = Callable[[str, str], Awaitable[dict[str, Any] | None]]


def review_response(uid: str, result: ValidationResult) -> dict[str, Any]:
    """The AdmissionReview answer (controller-runtime's conventions, spec §6.0)."""
    response: dict[str, Any] = {"uid": uid, "allowed": result.allowed}
    if result.warnings:
        response["warnings"] = list(result.warnings)
    if not result.allowed:
        code = result.code if result.code in (403, 422) else 403
        response["status"] = {
            "metadata": {},
            "code": code,
            "reason": "Forbidden" if code == 403 else "Invalid",
            "message": aggregate_message(result.texts()),
        }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def json_response(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(body, separators=(",", ":")).encode(), status=status,
                        content_type="application/json")


def bad_review(detail: str) -> web.Response:
    return json_response({"error": detail}, status=400)


REVIEW_API_VERSION = "admission.k8s.io/v1"
# Requests in flight when the server stops get this long to finish.
SHUTDOWN_S = 5.0
# An AdmissionReview holds the object and the old object, each at most the API server's 3 MiB
# request limit: anything much larger is not from an API server, and is refused unread.
MAX_REVIEW_BYTES = 8 * 1024 * 1024


async def _read_limited(request: web.Request) -> bytes | None:
    """The body, or None when it is larger than MAX_REVIEW_BYTES (read no further)."""
    length = request.content_length
    if length is not None and length > MAX_REVIEW_BYTES:
        return None
    chunks, size = [], 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > MAX_REVIEW_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _named_kind(value: Any) -> str:
    return repr(value.get("kind")) if isinstance(value, dict) else f"a {type(value).__name__}"


PATHS = frozenset(path for _, path, _ in WEBHOOKS) | {DEFAULTER_PATH}


@web.middleware
async def webhook_metrics(request: web.Request, handler: Any) -> web.StreamResponse:
    """controller-runtime's webhook metrics: by path and HTTP code, latency, in flight."""
    path = request.path
    if path not in PATHS:
        return await handler(request)
    started = time.perf_counter()
    in_flight = metrics.WEBHOOK_IN_FLIGHT.labels(path)
    in_flight.inc()
    code = "500"
    try:
        response = await handler(request)
        code = str(response.status)
        return response
    except web.HTTPException as err:
        code = str(err.status)
        raise
    finally:
        in_flight.dec()
        metrics.WEBHOOK_LATENCY.labels(path).observe(time.perf_counter() - started)
        metrics.WEBHOOK_REQUESTS_BY_CODE.labels(path, code).inc()


@web.middleware
async def server_span(request: web.Request, handler: Any) -> web.StreamResponse:
    """A server span per admission request, a child of the caller's when the API server sends
    a ``traceparent`` (made only when spans leave the process: trainyard.telemetry.detail)."""
    from trainyard.telemetry import detail

    if not detail.enabled():
        return await handler(request)
    from opentelemetry import propagate, trace

    tracer = trace.get_tracer("trainyard.planner.webhook")
    with tracer.start_as_current_span(f"{request.method} {request.path}", context=propagate.extract(request.headers),
                                      kind=trace.SpanKind.SERVER,
                                      attributes={"http.request.method": request.method,
                                                  "url.path": request.path}) as span:
        response = await handler(request)
        span.set_attribute("http.response.status_code", response.status)
        return response


async def read_review(request: web.Request, kind: str) -> tuple[dict[str, Any], str] | web.Response:
    """The review's request, or a 400 naming what is wrong: the review itself
    (admission.k8s.io/v1 AdmissionReview), its uid, or an object or oldObject that is not
    of the kind this webhook admits (a Scale on the scale subresource)."""
    raw = await _read_limited(request)
    if raw is None:
        return bad_review(f"request body: larger than {MAX_REVIEW_BYTES // (1024 * 1024)} MiB")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return bad_review("request body: not JSON")
    if not isinstance(body, dict):
        return bad_review("request body: not a JSON object")
    review = body.get("request")
    if not isinstance(review, dict):
        return bad_review("request: missing AdmissionReview.request")
    uid = review.get("uid")
    if not isinstance(uid, str) or not uid:
        return bad_review("request.uid: missing (a non-empty string)")
    if not isinstance(review.get("object"), dict):
        return bad_review("request.object: missing")
    expected = "Scale" if kind == "TrainJob" and review.get("subResource") == "scale" else kind
    for field in ("object", "oldObject"):
        value = review.get(field)
        if field == "oldObject" and value is None:
            continue
        if not isinstance(value, dict) or value.get("kind") != expected:
            return bad_review(f"request.{field}.kind: expected {expected}, got {_named_kind(value)[:80]}")
    if body.get("apiVersion") != REVIEW_API_VERSION or body.get("kind") != "AdmissionReview":
        return bad_review(f"apiVersion, kind: expected {REVIEW_API_VERSION} AdmissionReview, got "
                          f"{str(body.get('apiVersion'))[:60]!r} {str(body.get('kind'))[:60]!r}")
    return review, uid


def build_app(observed_for: ObservedLookup, trainjob_for: TrainJobLookup | None = None,
              compat: TrainerCompat = DEFAULT_COMPAT) -> web.Application:
    """``compat``: which release's admission rules apply where v2.1.0 and v2.3.0 differ."""
    # The body's size limit is _read_limited's (aiohttp's own applies to request.read() only).
    app = web.Application(middlewares=[server_span, webhook_metrics])
    for path in PATHS:
        metrics.WEBHOOK_LATENCY.labels(path)
        metrics.WEBHOOK_IN_FLIGHT.labels(path)
        for code in ("200", "400", "500"):
            metrics.WEBHOOK_REQUESTS_BY_CODE.labels(path, code)
    for _, _, resource in WEBHOOKS:
        for allowed in ("true", "false"):
            metrics.WEBHOOK_REQUESTS.labels(resource, allowed)

    async def trainjob(request: web.Request) -> web.Response:
        parsed = await read_review(request, "TrainJob")
        if isinstance(parsed, web.Response):
            return parsed
        review, uid = parsed
        new, old = review["object"], review.get("oldObject") or None
        if review.get("subResource") == "scale":
            return await scale(review, uid)
        update = review.get("operation") == "UPDATE"
        observed = await observed_for(new, jobset=update)
        result = validate_trainjob(new, old if update else None, None, observed, compat=compat)
        metrics.WEBHOOK_REQUESTS.labels("trainjobs", str(result.allowed).lower()).inc()
        return json_response(review_response(uid, result))

    async def scale(review: dict[str, Any], uid: str) -> web.Response:
        """kubectl scale / an HPA: the TrainJob's numNodes set to the Scale's replicas (#17)."""
        meta = review["object"].get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        name = str(review.get("name") or meta.get("name") or "")
        namespace = str(review.get("namespace") or meta.get("namespace") or "")
        trainjob = await trainjob_for(namespace, name) if trainjob_for is not None else None
        if trainjob is None:  # gone: the API server answers NotFound itself
            result = ValidationResult()
        else:
            observed = await observed_for(trainjob)
            result = validate_trainjob_scale(review["object"], review.get("oldObject") or None, trainjob,
                                             None, observed, compat)
        metrics.WEBHOOK_REQUESTS.labels("trainjobs", str(result.allowed).lower()).inc()
        return json_response(review_response(uid, result))

    async def runtime(request: web.Request, resource: str) -> web.Response:
        kind = "ClusterTrainingRuntime" if resource == "clustertrainingruntimes" else "TrainingRuntime"
        parsed = await read_review(request, kind)
        if isinstance(parsed, web.Response):
            return parsed
        review, uid = parsed
        old = review.get("oldObject") if review.get("operation") == "UPDATE" else None
        result = validate_runtime(review["object"], old or None)
        metrics.WEBHOOK_REQUESTS.labels(resource, str(result.allowed).lower()).inc()
        return json_response(review_response(uid, result))

    async def trainjob_defaulter(request: web.Request) -> web.Response:
        """v2.3.0's TrainJob mutating webhook: ``runtimePatches[].time`` (registered only at the
        v2.3 level; at v2.1 it answers without a patch, as if it were not there)."""
        parsed = await read_review(request, "TrainJob")
        if isinstance(parsed, web.Response):
            return parsed
        review, uid = parsed
        response: dict[str, Any] = {"uid": uid, "allowed": True}
        if compat.v2_3:
            old = review.get("oldObject") if review.get("operation") == "UPDATE" else None
            operations = runtime_patch_times(review["object"], old if isinstance(old, dict) else None,
                                             datetime.now(timezone.utc))
            if operations:
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(json.dumps(operations).encode()).decode("ascii")
        return json_response({"apiVersion": REVIEW_API_VERSION, "kind": "AdmissionReview", "response": response})

    async def cluster_training_runtime(request: web.Request) -> web.Response:
        return await runtime(request, "clustertrainingruntimes")

    async def training_runtime(request: web.Request) -> web.Response:
        return await runtime(request, "trainingruntimes")

    app.router.add_post(WEBHOOKS[0][1], cluster_training_runtime)
    app.router.add_post(WEBHOOKS[1][1], training_runtime)
    app.router.add_post(WEBHOOKS[2][1], trainjob)
    app.router.add_post(DEFAULTER_PATH, trainjob_defaulter)
    return app


def webhook_configuration(ca_bundle: bytes, *, url_base: str | None, service: tuple[str, str] | None,
                          service_port: int = 443) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration (spec §6.0) pointing at this planner."""
    webhooks = []
    for name, path, resource in WEBHOOKS:
        # trainjobs/scale too: kubectl scale and HPAs resize elastic TrainJobs through it, and a
        # rule on trainjobs alone does not see subresource requests.
        resources = [resource, f"{resource}/scale"] if resource == "trainjobs" else [resource]
        client: dict[str, Any] = {"caBundle": base64.b64encode(ca_bundle).decode("ascii")}
        if url_base:
            client["url"] = url_base.rstrip("/") + path
        elif service:
            client["service"] = {"name": service[0], "namespace": service[1], "path": path,
                                 "port": service_port}
        webhooks.append({
            "name": name,
            "admissionReviewVersions": ["v1"],
            "clientConfig": client,
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "rules": [{"apiGroups": [GROUP], "apiVersions": ["v1alpha1"],
                       "operations": ["CREATE", "UPDATE"], "resources": resources}],
        })
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": CONFIGURATION_NAME}, "webhooks": webhooks}


def mutating_webhook_configuration(ca_bundle: bytes, *, url_base: str | None, service: tuple[str, str] | None,
                                   service_port: int = 443) -> dict[str, Any]:
    """v2.3.0's MutatingWebhookConfiguration (``defaulter.trainer.kubeflow.org``): TrainJob creates
    and updates, answered by the same planner replicas as the validating webhooks."""
    client: dict[str, Any] = {"caBundle": base64.b64encode(ca_bundle).decode("ascii")}
    if url_base:
        client["url"] = url_base.rstrip("/") + DEFAULTER_PATH
    elif service:
        client["service"] = {"name": service[0], "namespace": service[1], "path": DEFAULTER_PATH,
                             "port": service_port}
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": DEFAULTER_CONFIGURATION},
            "webhooks": [{"name": DEFAULTER_WEBHOOK, "admissionReviewVersions": ["v1"], "clientConfig": client,
                          "failurePolicy": "Fail", "sideEffects": "None",
                          "rules": [{"apiGroups": [GROUP], "apiVersions": ["v1alpha1"],
                                     "operations": ["CREATE", "UPDATE"], "resources": ["trainjobs"]}]}]}


class TlsFiles:
    """Cert and key written to a private temp dir (ssl loads files), reloadable."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="trainyard-webhook-")
        self.cert = os.path.join(self.dir, "tls.crt")
        self.key = os.path.join(self.dir, "tls.key")
        self.context: ssl.SSLContext | None = None

    def write(self, cert_pem: bytes, key_pem: bytes) -> None:
        for path, data in ((self.cert, cert_pem), (self.key, key_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
        if self.context is not None:
            # New handshakes use the new certificate; open connections keep theirs.
            self.context.load_cert_chain(self.cert, self.key)

    def cleanup(self) -> None:
        for path in (self.cert, self.key):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        try:
            os.rmdir(self.dir)
        except OSError:
            pass


class WebhookServer:
    """Serves ``app`` over HTTPS with ``tls``'s certificate (reloaded in place by TlsFiles.write)."""

    def __init__(self, app: web.Application, host: str, port: int, tls: TlsFiles) -> None:
        self._app = app
        self._host = host
        self._port = port
        self._tls = tls
        self._runner: web.AppRunner | None = None
        self.bound_port: int | None = None

    async def start(self) -> int:
        # IPPROTO_TCP, not the default 0: asyncio turns on TCP_NODELAY only for sockets whose
        # proto says TCP, and without it each answer waited ~40 ms for the API server's delayed ACK.
        sock = socket.socket(socket.AF_INET6 if ":" in self._host else socket.AF_INET, socket.SOCK_STREAM,
                             socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._host, self._port))
        self.bound_port = sock.getsockname()[1]
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self._tls.cert, self._tls.key)
        self._tls.context = context
        # The requests in flight at a stop get SHUTDOWN_S to finish; the process's signals stay
        # with the service's own graceful shutdown (handle_signals=False).
        self._runner = web.AppRunner(self._app, access_log=None, handle_signals=False,
                                     shutdown_timeout=SHUTDOWN_S)
        await self._runner.setup()
        await web.SockSite(self._runner, sock, ssl_context=context).start()
        return self.bound_port

    async def stop(self) -> None:
        """Stops accepting, then lets the requests in flight finish (up to SHUTDOWN_S)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
