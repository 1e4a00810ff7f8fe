"""The status endpoint's decisions (v2.3.0 TrainJobStatus), pure: which requests are
authorized and what status a progress report writes.

A trainer pod POSTs ``{"trainerStatus": {...}}`` to ``status_path(ns, name)`` with
``Authorization: Bearer <projected token>``. It is authorized when the token verifies against
the issuer's key set (OIDC discovery of the cluster's ServiceAccount issuer), carries the
TrainJob's audience ``token_audience(ns, name)`` and names the TrainJob's namespace. The write
is a server-side apply of ``status.trainerStatus`` (field manager ``trainer-status``, forced);
the API server's schema then checks bounds (progress 0-100, at most 256 metrics, ...).
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from trainyard.apimachinery import serviceaccount_tokens as sat
from trainyard.api import constants as c


FIELD_MANAGER = "trainer-status"
MAX_BODY_BYTES = 1 << 16


def token_audience(namespace: str, name: str) -> str:
    return f"{c.TRAINER_API_GROUP}/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"


def status_path(namespace: str, name: str) -> str:
    return f"/apis/{c.TRAINER_API_GROUP}/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"


def bearer_token(header: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header ('' when it is not one)."""
    parts = (header or "").split()
    return parts[1] if len(parts) == 2 and parts[0].lower() == "bearer" else ""


def authorized(header: str | None, namespace: str, name: str, key_set: dict[str, Any], *, issuer: str,
               now: int) -> bool:
    """Whether the request may write this TrainJob's trainer status."""
    try:
        claims = sat.verify(bearer_token(header), key_set, issuer=issuer, audience=token_audience(namespace, name),
                            now=now)
    except sat.TokenError:
        return False
    scope = claims.get("kubernetes.io")
    return isinstance(scope, dict) and scope.get("namespace") == namespace


class InvalidPayload(ValueError):
    """The body is not an UpdateTrainJobStatusRequest (upstream answers 422 "Invalid payload")."""


def _rfc3339(value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidPayload("lastUpdatedTime must be a string")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as err:
        raise InvalidPayload("lastUpdatedTime is not an RFC 3339 time") from err
    if parsed.tzinfo is None:
        raise InvalidPayload("lastUpdatedTime has no time zone")
    # As a metav1.Time: UTC, whole seconds.
    return parsed.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _int(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidPayload(f"{field} must be an integer")
    return value


def status_apply(namespace: str, name: str, request: Any) -> dict[str, Any] | None:
    """The apply configuration a report writes; None when it carries no ``trainerStatus``
    (answered 200 without a write, as upstream). Raises InvalidPayload for a malformed body."""
    if not isinstance(request, dict):
        raise InvalidPayload("the body must be a JSON object")
    reported = request.get("trainerStatus")
    if reported is None:
        return None
    if not isinstance(reported, dict):
        raise InvalidPayload("trainerStatus must be an object")
    status: dict[str, Any] = {}
    if reported.get("progressPercentage") is not None:
        status["progressPercentage"] = _int(reported["progressPercentage"], "progressPercentage")
    if reported.get("estimatedRemainingSeconds") is not None:
        status["estimatedRemainingSeconds"] = _int(reported["estimatedRemainingSeconds"], "estimatedRemainingSeconds")
    metrics = reported.get("metrics")
    if metrics is not None:
        if not isinstance(metrics, list) or not all(
                isinstance(m, dict) and all(isinstance(m.get(k, ""), str) for k in ("name", "value")) for m in metrics):
            raise InvalidPayload("metrics must be a list of {name, value} strings")
        status["metrics"] = [{"name": m.get("name", ""), "value": m.get("value", "")} for m in metrics]
    if reported.get("lastUpdatedTime") is not None:
        status["lastUpdatedTime"] = _rfc3339(reported["lastUpdatedTime"])
    return {"apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAIN_JOB_KIND,
            "metadata": {"name": name, "namespace": namespace}, "status": {"trainerStatus": status}}
