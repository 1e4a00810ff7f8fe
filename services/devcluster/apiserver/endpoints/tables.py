"""``meta.k8s.io/v1`` Table responses for ``kubectl get``: printer columns and humanised ages."""
from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Any, Callable

from ..registry.kinds import ResourceType

TABLE_MEDIA_TYPE = "application/json;as=Table;v=v1;g=meta.k8s.io"
_NAME_COLUMN = {"name": "Name", "type": "string", "format": "name", "priority": 0,
                "description": "Name must be unique within a namespace."}
_AGE_COLUMN = {"name": "Age", "type": "date", "format": "", "priority": 0,
               "description": "CreationTimestamp is a timestamp representing the server time when this object was created."}


def wants_table(accept: str) -> bool:
    compact = accept.replace(" ", "")
    return "as=Table" in compact and "g=meta.k8s.io" in compact


def humanise_age(timestamp: Any) -> str | None:
    if not isinstance(timestamp, str):
        return None
    try:
        then = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return None
    seconds = max(0, int((datetime.now(timezone.utc) - then).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        rest = seconds % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    return f"{days}d" if days < 365 * 2 else f"{days // 365}y"


# ---------------------------------------------------------------- a small JSONPath

# A field name may escape dots (``.metadata.labels.trainer\.kubeflow\.org/framework``): label and
# annotation keys are written that way in printer columns.
_TOKEN = re.compile(r"\.((?:\\\.|[A-Za-z0-9_\-/])+)|\[(-?\d*):(-?\d*)\]|\[(-?\d+)\]|\[\?\(@\.([A-Za-z0-9_.\-]+)\s*==\s*[\"']([^\"']*)[\"']\)\]|\[\*\]|\.\*")


def jsonpath(obj: Any, path: str) -> list[Any]:
    """Evaluate the JSONPath subset printer columns use: fields, [n], [a:b], [*], [?(@.k=="v")]."""
    expr = path.strip()
    if expr.startswith("{") and expr.endswith("}"):
        expr = expr[1:-1]
    if expr.startswith("$"):
        expr = expr[1:]
    if not expr.startswith(".") and not expr.startswith("["):
        expr = "." + expr
    current = [obj]
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m:
            return []
        pos = m.end()
        field, start, stop, index, fkey, fval = m.groups()
        if field is not None:
            field = field.replace("\\.", ".")
        nxt: list[Any] = []
        for value in current:
            if field is not None:
                if isinstance(value, dict) and field in value:
                    nxt.append(value[field])
            elif index is not None:
                if isinstance(value, list):
                    i = int(index)
                    if -len(value) <= i < len(value):
                        nxt.append(value[i])
            elif m.group(0) in ("[*]", ".*"):
                if isinstance(value, list):
                    nxt.extend(value)
                elif isinstance(value, dict):
                    nxt.extend(value.values())
            elif fkey is not None:
                if isinstance(value, list):
                    for item in value:
                        found = jsonpath(item, "." + fkey)
                        if found and str(found[0]) == fval:
                            nxt.append(item)
            else:
                if isinstance(value, list):
                    s = int(start) if start else None
                    e = int(stop) if stop else None
                    nxt.extend(value[s:e])
        current = nxt
    return current


def _cell(value_list: list[Any], column_type: str) -> Any:
    if not value_list:
        return None
    value = value_list[0] if len(value_list) == 1 else value_list
    if column_type == "date":
        return humanise_age(value)
    if column_type in ("integer", "number", "boolean"):
        return value
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# ---------------------------------------------------------------- built-in columns

def _pod_cells(obj: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    containers = spec.get("containers") or []
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    restarts = sum(int(s.get("restartCount") or 0) for s in statuses)
    phase = status.get("phase") or "Pending"
    shown = phase
    for s in statuses:
        state = s.get("state") or {}
        if "waiting" in state and state["waiting"].get("reason"):
            shown = state["waiting"]["reason"]
        elif "terminated" in state and phase not in ("Succeeded", "Failed") and state["terminated"].get("reason"):
            shown = state["terminated"]["reason"]
    if phase == "Succeeded":
        shown = "Completed"
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        shown = "Terminating"
    base = [obj["metadata"]["name"], f"{ready}/{len(containers)}", shown, restarts,
            humanise_age(obj["metadata"].get("creationTimestamp"))]
    wide = [status.get("podIP") or "<none>", spec.get("nodeName") or "<none>", "<none>", "<none>"]
    return base, wide


_POD_COLUMNS = [
    _NAME_COLUMN,
    {"name": "Ready", "type": "string", "format": "", "priority": 0, "description": "The aggregate readiness state of this pod for accepting traffic."},
    {"name": "Status", "type": "string", "format": "", "priority": 0, "description": "The aggregate status of the containers in this pod."},
    {"name": "Restarts", "type": "string", "format": "", "priority": 0, "description": "The number of times the containers in this pod have been restarted."},
    _AGE_COLUMN,
    {"name": "IP", "type": "string", "format": "", "priority": 1, "description": "IP address allocated to the pod."},
    {"name": "Node", "type": "string", "format": "", "priority": 1, "description": "Name of the node assigned to the pod."},
    {"name": "Nominated Node", "type": "string", "format": "", "priority": 1, "description": "Nominated node."},
    {"name": "Readiness Gates", "type": "string", "format": "", "priority": 1, "description": "Readiness gates."},
]


def _simple(name: str, kind: str = "string", priority: int = 0) -> dict[str, Any]:
    return {"name": name, "type": kind, "format": "", "priority": priority, "description": ""}


Printer = tuple[list[dict[str, Any]], Callable[[dict[str, Any]], list[Any]]]
# The columns and cells of each built-in kind, registered by storage key as kube-apiserver's
# printers register a handler per type (pkg/printers/internalversion).
_PRINTERS: dict[tuple[str, str], Printer] = {}


def _printer(*keys: tuple[str, str], columns: list[dict[str, Any]]
             ) -> Callable[[Callable[[dict[str, Any]], list[Any]]], Callable[[dict[str, Any]], list[Any]]]:
    def register(cells: Callable[[dict[str, Any]], list[Any]]) -> Callable[[dict[str, Any]], list[Any]]:
        for key in keys:
            _PRINTERS[key] = (columns, cells)
        return cells
    return register


def _age(o: dict[str, Any]) -> str | None:
    return humanise_age(o["metadata"].get("creationTimestamp"))


@_printer(("", "pods"), columns=_POD_COLUMNS)
def _pod(o: dict[str, Any]) -> list[Any]:
    return sum(_pod_cells(o), [])


@_printer(("", "namespaces"), columns=[_NAME_COLUMN, _simple("Status"), _AGE_COLUMN])
def _namespace(o: dict[str, Any]) -> list[Any]:
    return [o["metadata"]["name"], (o.get("status") or {}).get("phase", "Active"), _age(o)]


@_printer(("batch", "jobs"), columns=[_NAME_COLUMN, _simple("Status"), _simple("Completions"), _simple("Duration"),
                                      _AGE_COLUMN])
def _job(o: dict[str, Any]) -> list[Any]:
    spec, status = o.get("spec") or {}, o.get("status") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    state = "Complete" if conditions.get("Complete") == "True" else "Failed" if conditions.get("Failed") == "True" \
        else "Suspended" if spec.get("suspend") else "Running"
    return [o["metadata"]["name"], state, f"{status.get('succeeded', 0)}/{spec.get('completions', 1)}", "", _age(o)]


@_printer(("", "services"), columns=[_NAME_COLUMN, _simple("Type"), _simple("Cluster-IP"), _simple("External-IP"),
                                     _simple("Port(s)"), _AGE_COLUMN])
def _service(o: dict[str, Any]) -> list[Any]:
    spec = o.get("spec") or {}
    ports = ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in spec.get("ports") or []) or "<none>"
    return [o["metadata"]["name"], spec.get("type", "ClusterIP"), spec.get("clusterIP", "<none>"), "<none>", ports, _age(o)]


def _data_count(o: dict[str, Any]) -> int:
    return len(o.get("data") or {}) + len(o.get("binaryData") or {})


@_printer(("", "configmaps"), columns=[_NAME_COLUMN, _simple("Data", "integer"), _AGE_COLUMN])
def _configmap(o: dict[str, Any]) -> list[Any]:
    return [o["metadata"]["name"], _data_count(o), _age(o)]


@_printer(("", "secrets"), columns=[_NAME_COLUMN, _simple("Type"), _simple("Data", "integer"), _AGE_COLUMN])
def _secret(o: dict[str, Any]) -> list[Any]:
    return [o["metadata"]["name"], o.get("type", "Opaque"), _data_count(o), _age(o)]


@_printer(("", "events"), columns=[_simple("Last Seen"), _simple("Type"), _simple("Reason"), _simple("Object"),
                                   _simple("Message")])
def _event(o: dict[str, Any]) -> list[Any]:
    inv = o.get("involvedObject") or {}
    return [humanise_age(o.get("lastTimestamp") or o.get("eventTime") or o["metadata"].get("creationTimestamp")),
            o.get("type", ""), o.get("reason", ""), f"{(inv.get('kind') or '').lower()}/{inv.get('name', '')}",
            o.get("message", "")]


@_printer(("", "nodes"), columns=[_NAME_COLUMN, _simple("Status"), _simple("Roles"), _AGE_COLUMN, _simple("Version")])
def _node(o: dict[str, Any]) -> list[Any]:
    status = o.get("status") or {}
    ready = next((c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    state = "Ready" if ready == "True" else "NotReady" if ready in ("False", "Unknown") else "Unknown"
    if (o.get("spec") or {}).get("unschedulable"):
        state += ",SchedulingDisabled"
    roles = sorted(k.split("/", 1)[1] for k in (o["metadata"].get("labels") or {})
                   if k.startswith("node-role.kubernetes.io/")) or ["<none>"]
    return [o["metadata"]["name"], state, ",".join(roles), _age(o), (status.get("nodeInfo") or {}).get("kubeletVersion", "")]


@_printer(("apiextensions.k8s.io", "customresourcedefinitions"), columns=[_NAME_COLUMN, _simple("Created At", "date")])
def _crd(o: dict[str, Any]) -> list[Any]:
    return [o["metadata"]["name"], o["metadata"].get("creationTimestamp")]


@_printer(("admissionregistration.k8s.io", "validatingadmissionpolicies"),
          columns=[_NAME_COLUMN, _simple("Validations", "integer"), _simple("ParamKind"), _AGE_COLUMN])
def _policy(o: dict[str, Any]) -> list[Any]:
    spec = o.get("spec") or {}
    kind = spec.get("paramKind")
    shown = f"{kind.get('apiVersion', '')}/{kind.get('kind', '')}" if isinstance(kind, dict) else "<unset>"
    return [o["metadata"]["name"], len(spec.get("validations") or []), shown, _age(o)]


@_printer(("admissionregistration.k8s.io", "validatingadmissionpolicybindings"),
          columns=[_NAME_COLUMN, _simple("PolicyName"), _simple("ParamRef"), _AGE_COLUMN])
def _policy_binding(o: dict[str, Any]) -> list[Any]:
    spec = o.get("spec") or {}
    ref, shown = spec.get("paramRef"), "<unset>"
    if isinstance(ref, dict) and ref.get("name"):
        shown = f"{ref.get('namespace') or '*'}/{ref['name']}"
    elif isinstance(ref, dict) and ref.get("selector") is not None:
        shown = _go_label_selector(ref["selector"])
    return [o["metadata"]["name"], spec.get("policyName", ""), shown, _age(o)]


def _builtin_columns(rt: ResourceType) -> Printer | None:
    return _PRINTERS.get(rt.storage_key)


def _go_label_selector(selector: dict[str, Any]) -> str:
    """A LabelSelector as Go's generated ``String()`` prints it (kube-apiserver's ParamRef cell)."""
    labels = selector.get("matchLabels") or {}
    pairs = "".join(f"{k}: {labels[k]}," for k in sorted(labels))
    requirements = "".join(
        f"LabelSelectorRequirement{{Key:{r.get('key', '')},Operator:{r.get('operator', '')},"
        f"Values:[{' '.join(r.get('values') or [])}],}},"
        for r in selector.get("matchExpressions") or [])
    return (f"&LabelSelector{{MatchLabels:map[string]string{{{pairs}}},"
            f"MatchExpressions:[]LabelSelectorRequirement{{{requirements}}},}}")


def columns_for(rt: ResourceType) -> list[dict[str, Any]]:
    builtin = _builtin_columns(rt) if rt.builtin else None
    if builtin is not None:
        return builtin[0]
    if rt.builtin or not rt.printer_columns:
        return [_NAME_COLUMN, _AGE_COLUMN]
    cols = [_NAME_COLUMN]
    for col in rt.printer_columns:
        cols.append({"name": col.get("name", ""), "type": col.get("type", "string"), "format": col.get("format", ""),
                     "description": col.get("description", ""), "priority": int(col.get("priority", 0))})
    return cols


def row_for(rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
    builtin = _builtin_columns(rt) if rt.builtin else None
    meta = obj.get("metadata") or {}
    if builtin is not None:
        cells = builtin[1](obj)
    elif rt.builtin or not rt.printer_columns:
        cells = [meta.get("name"), humanise_age(meta.get("creationTimestamp"))]
    else:
        cells = [meta.get("name")]
        for col in rt.printer_columns:
            cells.append(_cell(jsonpath(obj, col.get("jsonPath", "")), col.get("type", "string")))
    partial = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta}
    return {"cells": cells, "object": partial}


def table(rt: ResourceType, objects: list[dict[str, Any]], resource_version: str, with_columns: bool = True,
          include_object: str = "Metadata") -> dict[str, Any]:
    rows = [row_for(rt, o) for o in objects]
    if include_object == "Object":
        for row, obj in zip(rows, objects):
            row["object"] = obj
    elif include_object == "None":
        for row in rows:
            row.pop("object", None)
    body: dict[str, Any] = {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version}}
    body["columnDefinitions"] = columns_for(rt) if with_columns else []
    body["rows"] = rows
    return body
