"""``events.k8s.io/v1`` Events are the core ``v1`` Events, stored once and converted field by field."""
from __future__ import annotations

from typing import Any

# (core v1 field, events.k8s.io/v1 field)
_RENAMED = (
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("source", "deprecatedSource"),
    ("reportingComponent", "reportingController"),
)
_SHARED = ("metadata", "reason", "type", "eventTime", "series", "action", "related", "reportingInstance")


def _convert(obj: dict[str, Any], api_version: str, pairs: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    out: dict[str, Any] = {"apiVersion": api_version, "kind": "Event"}
    for key in _SHARED:
        if key in obj:
            out[key] = obj[key]
    for source, target in pairs:
        if source in obj:
            out[target] = obj[source]
    return out


def core_to_events_v1(obj: dict[str, Any]) -> dict[str, Any]:
    return _convert(obj, "events.k8s.io/v1", _RENAMED)


def events_v1_to_core(obj: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(obj, dict):
        return obj
    converted = _convert(obj, "v1", tuple((b, a) for a, b in _RENAMED))
    if obj.get("kind") not in (None, "Event"):
        converted["kind"] = obj["kind"]  # keep a wrong kind wrong: it is reported as such
    if obj.get("apiVersion") not in (None, "events.k8s.io/v1"):
        converted["apiVersion"] = obj["apiVersion"]
    return converted

