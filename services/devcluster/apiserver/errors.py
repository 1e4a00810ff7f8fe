"""Kubernetes ``Status`` error objects: every non-2xx answer of the server is one of these."""
from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error answered to the client as a ``Status`` body with ``code`` and ``reason``."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


class StaleObject(ApiError):
    """A commit's compare-and-swap lost: the object changed, appeared or went since the write read
    it. Answered as ``base`` (409 Conflict, 409 AlreadyExists or 404) unless the writer had no
    precondition from its client: then it recomputes the write on the new object and commits
    again (``apiserver.guaranteed``, kube-apiserver's GuaranteedUpdate). ``key`` names the object
    ((group, resource), namespace, name) so only the write of that object retries."""

    def __init__(self, base: ApiError, key: tuple[tuple[str, str], str, str]) -> None:
        super().__init__(base.code, base.reason, base.message, base.details)
        self.key = key


def _details(name: str, group: str, kind: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = kind
    return details


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def not_found_path() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource")


def not_found(qualified_resource: str, name: str, group: str, resource: str) -> ApiError:
    return ApiError(404, "NotFound", f'{qualified_resource} "{name}" not found', _details(name, group, resource))


def already_exists(qualified_resource: str, name: str, group: str, resource: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{qualified_resource} "{name}" already exists', _details(name, group, resource))


def conflict(qualified_resource: str, name: str, group: str, resource: str, why: str | None = None) -> ApiError:
    why = why or "the object has been modified; please apply your changes to the latest version and try again"
    return ApiError(
        409, "Conflict", f'Operation cannot be fulfilled on {qualified_resource} "{name}": {why}',
        _details(name, group, resource),
    )


def method_not_allowed(verb: str, qualified_resource: str, group: str, resource: str) -> ApiError:
    details: dict[str, Any] = {}
    if group:
        details["group"] = group
    details["kind"] = resource
    return ApiError(405, "MethodNotAllowed", f'{verb} is not supported on resources of kind "{qualified_resource}"', details)


def unsupported_media_type(accepted: list[str]) -> ApiError:
    return ApiError(
        415, "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: " + ", ".join(accepted),
    )


def invalid(qualified_kind: str, name: str, group: str, kind: str, causes: list[dict[str, str]]) -> ApiError:
    """422 Invalid; ``causes`` items are ``{"reason", "message", "field"}``."""
    texts = [f"{c['field']}: {c['message']}" if c.get("field") else c["message"] for c in causes]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    details = _details(name, group, kind)
    details["causes"] = causes
    return ApiError(422, "Invalid", f'{qualified_kind} "{name}" is invalid: {joined}', details)


def field_cause(field: str, reason: str, message: str) -> dict[str, str]:
    return {"reason": reason, "message": message, "field": field}


def too_large(limit: int) -> ApiError:
    return ApiError(413, "RequestEntityTooLarge", f"Request entity too large: limit is {limit}")


def internal(message: str) -> ApiError:
    return ApiError(500, "InternalError", f"Internal error occurred: {message}")


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")
