"""Request bodies in and answers out, as kube-apiserver's endpoints read and write them: the
body's size limit, JSON, YAML and protobuf objects, patch types, the write options a request's
query asks for, and JSON answers with their Warning headers. The server's handlers and the
subresources use it alike."""
from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from . import errors
from .query import parse_bool
from .registry import machinery
from .registry.options import AUDIT_ANNOTATIONS, WriteOptions
from ..storage.store import dumps

MAX_BODY = 3 * 1024 * 1024
JSON = "application/json"
PATCH_TYPES = {
    "application/merge-patch+json": "merge",
    "application/json-patch+json": "json",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
    "application/apply-patch+json": "apply",
}


_CONTROL = re.compile("[\x00-\x1f\x7f]")


def _warning_header(text: str) -> str:
    # A control character (from a field name in the body) may not appear in a header at all:
    # aiohttp drops the connection instead of answering. Written as a \u escape instead.
    text = text.replace("\\", "\\\\").replace('"', '\\"')
    return '299 - "' + _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text) + '"'


def json_response(body: Any, status: int = 200, content_type: str = JSON, warnings: list[str] | None = None) -> web.Response:
    raw = body if isinstance(body, bytes) else dumps(body)
    response = web.Response(body=raw, status=status)
    response.headers["Content-Type"] = content_type
    for text in warnings or []:
        response.headers.add("Warning", _warning_header(text))
    return response


def write_options(request: web.Request, query: dict[str, str], subresource: str | None) -> WriteOptions:
    manager = query.get("fieldManager") or request.headers.get("User-Agent", "").split("/", 1)[0] or "unknown"
    if len(manager) > 128:
        raise errors.bad_request("fieldManager: Too long: may not be more than 128 bytes")
    validation = query.get("fieldValidation") or "Warn"
    if validation not in ("Strict", "Warn", "Ignore"):
        raise errors.bad_request(f'Invalid value: "{validation}": fieldValidation must be one of "Ignore", "Warn", or "Strict"')
    dry_run = query.get("dryRun", "")
    if dry_run not in ("", "All"):
        raise errors.bad_request(f'Unsupported value: "{dry_run}": supported values: "All"')
    return WriteOptions(audit_annotations=request.setdefault(AUDIT_ANNOTATIONS, {}),
                        manager=manager, manager_given=bool(query.get("fieldManager")),
                        field_validation=validation, dry_run=dry_run == "All",
                        force=parse_bool(query.get("force"), "force"), subresource=subresource,
                        user=request.get("user"))

async def read_body(request: web.Request) -> bytes:
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise errors.too_large(MAX_BODY)
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge as err:
        raise errors.too_large(MAX_BODY) from err
    if len(body) > MAX_BODY:
        raise errors.too_large(MAX_BODY)
    return body

async def decode_object(request: web.Request) -> Any:
    body = await read_body(request)
    content_type = (request.headers.get("Content-Type") or JSON).split(";")[0].strip().lower()
    if content_type == "application/vnd.kubernetes.protobuf":
        return machinery.decode_protobuf(body)
    if not body.strip():
        raise errors.bad_request("the request body is empty: expected a JSON object")
    if content_type in ("application/yaml", "application/x-yaml", "text/yaml"):
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as err:
            raise errors.bad_request(f"error decoding YAML: {err}") from err
        return machinery.load_yaml(text)
    if content_type not in ("application/json", "*/*", ""):
        raise errors.unsupported_media_type(["application/json", "application/yaml", "application/vnd.kubernetes.protobuf"])
    try:
        return machinery.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise errors.bad_request(f"error decoding the request body as JSON: {err}") from err


def patch_type(request: web.Request) -> str | None:
    """The patch type a PATCH's Content-Type names (None: not a patch type)."""
    content_type = (request.headers.get("Content-Type") or "").split(";")[0].strip().lower()
    return PATCH_TYPES.get(content_type)
