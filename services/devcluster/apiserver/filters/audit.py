"""The audit log: kube-apiserver's log backend (``--audit-log-path``), with a fixed policy.

kube-apiserver writes one ``audit.k8s.io/v1`` ``Event`` per request and stage as JSON lines;
which requests and how much of them is its ``--audit-policy-file``. devcluster takes no policy
file: with ``--audit-log-path`` it records every request that reaches authentication at level
``Metadata`` and stage ``ResponseComplete`` (a watch when it ends), with the annotations
admission added to the request (ValidatingAdmissionPolicy ``auditAnnotations`` as
``<policy>/<key>``, and ``validation.policy.admission.k8s.io/validation_failure`` for bindings
with the ``Audit`` action). Each line is written (line-buffered) before the answer is sent, so a
client that got its answer finds the request's event in the file (``-``: stdout, as
kube-apiserver).
"""
from __future__ import annotations

import json
import sys
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, Mapping

from trainyard.apimachinery import rbac

AUTHENTICATED_USER = "devcluster.authenticated_user"  # request key of the user before impersonation


def _micro_time(moment: datetime) -> str:
    """metav1.MicroTime as JSON: RFC 3339 with microseconds, UTC."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class AuditLog:
    def __init__(self, path: str) -> None:
        self.path = path
        self._out: IO[str] = sys.stdout if path == "-" else Path(path).open("a", encoding="utf-8", buffering=1)

    def event(self, user: rbac.UserInfo | None, authenticated: rbac.UserInfo | None, info: rbac.Attributes,
              request_uri: str, source_ip: str, user_agent: str, code: int, received: datetime,
              annotations: Mapping[str, str]) -> dict[str, Any]:
        """The Metadata-level ``Event`` of one finished request."""
        event: dict[str, Any] = {
            "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata", "auditID": str(uuid.uuid4()),
            "stage": "ResponseComplete", "requestURI": request_uri, "verb": info.verb,
        }
        who = authenticated or user
        if who is not None:
            event["user"] = who.as_json()
            if user is not None and authenticated is not None and user != authenticated:
                event["impersonatedUser"] = user.as_json()
        event["sourceIPs"] = [source_ip] if source_ip else []
        if user_agent:
            event["userAgent"] = user_agent
        if info.resource_request:
            ref = {"resource": info.resource, "namespace": info.namespace, "name": info.name,
                   "apiGroup": info.api_group, "apiVersion": info.api_version, "subresource": info.subresource}
            event["objectRef"] = {k: v for k, v in ref.items() if v}
        event["responseStatus"] = {"metadata": {}, "code": code}
        event["requestReceivedTimestamp"] = _micro_time(received)
        event["stageTimestamp"] = _micro_time(datetime.now(timezone.utc))
        if annotations:
            event["annotations"] = dict(annotations)
        return event

    def write(self, event: dict[str, Any]) -> None:
        # a local append of one line: microseconds, so it stays on the event loop
        self._out.write(json.dumps(event, separators=(",", ":")) + "\n")
        if self._out is sys.stdout:
            self._out.flush()

    def close(self) -> None:
        self._out.flush()
        if self._out is not sys.stdout:
            self._out.close()
