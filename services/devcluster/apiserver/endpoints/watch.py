"""Watch streams: parameters, selector transitions, event encoding (JSON or Table), bookmarks.

A watch reads the store's change history from its resourceVersion, filters each change against
the old and the new object (so label changes become ADDED/DELETED), writes events as chunks,
and ends on ``timeoutSeconds``, a client that went away, a too-old resourceVersion (410) or
server shutdown.
"""
from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from typing import Any, Callable

from aiohttp import web

from .. import errors
from ..registry import machinery
from . import tables
from ..errors import ApiError
from ..registry.kinds import ResourceType
from ..registry.store import Api
from ...storage.store import Change, Expired, StoredObject, dumps
from . import metrics as devcluster_metrics

BOOKMARK_INTERVAL = 30.0
DEAD_CLIENT_CHECK = 5.0  # seconds between checks that the client is still there


@dataclass(frozen=True)
class WatchOptions:
    label_selector: str
    field_selector: str
    bookmarks: bool
    deadline: float  # time.monotonic() at which the stream ends
    start_rv: int | None  # None: start with the current state (synthetic ADDED events)
    initial_events_end: bool  # WatchList: a bookmark marks the end of the initial events
    include_object: str


def parse_watch_options(query: dict[str, str], parse_bool: Callable[[str | None, str], bool]) -> WatchOptions:
    bookmarks = parse_bool(query.get("allowWatchBookmarks"), "allowWatchBookmarks")
    timeout = query.get("timeoutSeconds")
    try:
        seconds = float(timeout) if timeout else 0.0
    except ValueError as err:
        raise errors.bad_request(f"invalid timeoutSeconds {timeout!r}") from err
    # no (or a zero) timeoutSeconds: the server picks 30-60 minutes, as upstream does
    deadline = time.monotonic() + (seconds if seconds > 0 else random.uniform(1800, 3600))
    initial_events = parse_bool(query.get("sendInitialEvents"), "sendInitialEvents")
    if initial_events and (not bookmarks or query.get("resourceVersionMatch") != "NotOlderThan"):
        raise ApiError(422, "Invalid", 'ListOptions.meta.k8s.io "" is invalid: sendInitialEvents: Forbidden: '
                       "sendInitialEvents is forbidden for watch unless allowWatchBookmarks=true and "
                       "resourceVersionMatch=NotOlderThan")
    rv_param = query.get("resourceVersion", "")
    start_rv = None
    if not initial_events and rv_param not in ("", "0"):
        try:
            start_rv = int(rv_param)
        except ValueError as err:
            raise errors.bad_request(f"invalid resourceVersion {rv_param!r}") from err
    return WatchOptions(query.get("labelSelector", ""), query.get("fieldSelector", ""), bookmarks, deadline,
                        start_rv, initial_events, query.get("includeObject", "Metadata"))


class WatchFilter:
    """Which changes a watch sees, and as what event type (selector transitions)."""

    def __init__(self, rt: ResourceType, namespace: str | None, options: WatchOptions) -> None:
        self.key = rt.storage_key
        self.namespace = namespace
        self.labels_ok = machinery.label_matcher(options.label_selector)
        self.fields_ok = machinery.field_matcher(rt, options.field_selector)

    def selects(self, namespace: str, name: str, labels: dict[str, str], raw: bytes) -> bool:
        if self.namespace is not None and namespace != self.namespace:
            return False
        if not self.labels_ok(labels):
            return False
        return self.fields_ok is None or self.fields_ok(namespace, name, StoredObject(0, raw, labels))

    def event_type(self, change: Change) -> str | None:
        if change.key != self.key:
            return None
        now_ok = self.selects(change.namespace, change.name, change.labels, change.raw)
        if change.type == "ADDED":
            return "ADDED" if now_ok else None
        was_ok = change.old_raw is not None and self.selects(change.namespace, change.name, change.old_labels or {},
                                                             change.old_raw)
        if change.type == "DELETED":
            return "DELETED" if (now_ok or was_ok) else None
        if now_ok and was_ok:
            return "MODIFIED"
        if now_ok:
            return "ADDED"
        return "DELETED" if was_ok else None


class EventEncoder:
    """Watch events as JSON lines; objects shared as stored bytes, or one-row Tables for kubectl."""

    def __init__(self, rt: ResourceType, view: Callable[[dict[str, Any]], dict[str, Any]], needs_view: bool,
                 as_table: bool, include_object: str) -> None:
        self.rt = rt
        self.view = view
        self.needs_view = needs_view
        self.as_table = as_table
        self.include_object = include_object
        self._columns_sent = False

    def event(self, event_type: str, raw: bytes) -> bytes:
        if self.as_table:
            obj = self.view(json.loads(raw))
            body = tables.table(self.rt, [obj], obj["metadata"].get("resourceVersion", ""),
                                with_columns=not self._columns_sent, include_object=self.include_object)
            self._columns_sent = True
            raw = dumps(body)
        elif self.needs_view:
            raw = dumps(self.view(json.loads(raw)))
        return b'{"type":"' + event_type.encode() + b'","object":' + raw + b"}\n"

    def bookmark(self, rv: int, initial_events_end: bool = False) -> bytes:
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_events_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return dumps({"type": "BOOKMARK", "object": {"kind": self.rt.kind, "apiVersion": self.rt.api_version,
                                                      "metadata": meta}}) + b"\n"

    @staticmethod
    def error(err: ApiError) -> bytes:
        return b'{"type":"ERROR","object":' + dumps(err.status()) + b"}\n"


async def stream(request: web.Request, api: Api, rt: ResourceType, namespace: str | None, options: WatchOptions,
                 as_table: bool, stopping: asyncio.Event) -> web.StreamResponse:
    store = api.store
    selection = WatchFilter(rt, namespace, options)
    encoder = EventEncoder(rt, lambda obj: api.view(rt, obj), api.needs_view(rt), as_table, options.include_object)
    response = web.StreamResponse(status=200)
    response.headers["Content-Type"] = tables.TABLE_MEDIA_TYPE if as_table else "application/json"
    response.enable_chunked_encoding()
    await response.prepare(request)
    try:
        if options.start_rv is None:
            last, items = api.list(rt, namespace, options.label_selector, options.field_selector)
            chunk = b"".join(encoder.event("ADDED", s.raw) for s in items)
            if options.initial_events_end:
                chunk += encoder.bookmark(last, initial_events_end=True)
            if chunk:
                await response.write(chunk)
        else:
            last = options.start_rv
        last_bookmark = time.monotonic()
        while not stopping.is_set():
            try:
                changes = store.changes_since(last)
            except Expired as err:
                await response.write(encoder.error(ApiError(410, "Expired", str(err))))
                break
            out = [encoder.event(kind, change.raw) for change in changes
                   if (kind := selection.event_type(change)) is not None]
            if changes:
                last = changes[-1].rv
            if out:
                await response.write(b"".join(out))
                devcluster_metrics.WATCH_EVENTS.labels(rt.group, rt.resource).inc(len(out))
            now = time.monotonic()
            if now >= options.deadline:
                if options.bookmarks:
                    await response.write(encoder.bookmark(last))
                break
            if options.bookmarks and now - last_bookmark >= BOOKMARK_INTERVAL:
                await response.write(encoder.bookmark(max(last, store.rv)))
                last_bookmark = now
            transport = request.transport
            if transport is None or transport.is_closing():
                break
            await store.wait_for_change(last, min(DEAD_CLIENT_CHECK, max(0.01, options.deadline - now)))
        await response.write_eof()
    except (ConnectionResetError, ConnectionError, asyncio.CancelledError):
        pass
    return response
