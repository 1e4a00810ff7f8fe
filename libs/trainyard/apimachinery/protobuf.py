"""Decode the protobuf request bodies kubectl sends for built-in kinds into JSON-shaped dicts.

Wire format (`Content-Type: application/vnd.kubernetes.protobuf`): the 4 magic bytes `k8s\\x00`,
then a `runtime.Unknown` message {1: typeMeta {1: apiVersion, 2: kind}, 2: raw, 3: contentEncoding,
4: contentType} whose `raw` is the typed object (Pod, ConfigMap, ...).

The result looks like the JSON body kubectl would have sent: field names are the JSON names,
embedded structs are inlined, bytes are base64, times are RFC 3339, quantities and int-or-string
values are their JSON forms, and zero scalars the Go JSON encoder would omit are left out (scalar
pointer fields where zero means something, e.g. `backoffLimit: 0`, are kept). Unknown fields are
skipped. Any malformed input raises `ProtobufDecodeError`.
"""
from __future__ import annotations

import base64
import datetime
import json
import struct
from functools import lru_cache
from typing import Any

from trainyard.apimachinery.errors import ProtobufDecodeError
from trainyard.apimachinery.protobuf_fields import MESSAGES

PROTOBUF_MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"

# (apiVersion, kind) -> message of the object.
KIND_MESSAGES: dict[tuple[str, str], str] = {
    ("v1", "Namespace"): "core.Namespace",
    ("v1", "ConfigMap"): "core.ConfigMap",
    ("v1", "Secret"): "core.Secret",
    ("v1", "ServiceAccount"): "core.ServiceAccount",
    ("v1", "Pod"): "core.Pod",
    ("v1", "Service"): "core.Service",
    ("v1", "Event"): "core.Event",
    ("batch/v1", "Job"): "batch.Job",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "autoscaling.HorizontalPodAutoscaler",
    ("coordination.k8s.io/v1", "Lease"): "coordination.Lease",
    ("events.k8s.io/v1", "Event"): "events.Event",
    ("authentication.k8s.io/v1", "TokenRequest"): "authentication.TokenRequest",
    ("authentication.k8s.io/v1", "SelfSubjectReview"): "authentication.SelfSubjectReview",
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"): "authorization.SelfSubjectAccessReview",
    ("authorization.k8s.io/v1", "SelfSubjectRulesReview"): "authorization.SelfSubjectRulesReview",
    ("authorization.k8s.io/v1", "SubjectAccessReview"): "authorization.SubjectAccessReview",
    ("authorization.k8s.io/v1", "LocalSubjectAccessReview"): "authorization.SubjectAccessReview",
    ("rbac.authorization.k8s.io/v1", "Role"): "rbac.Role",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "rbac.ClusterRole",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rbac.RoleBinding",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "rbac.RoleBinding",
}

# Scalar fields that are pointers in the Go types: present on the wire means set, even when zero.
POINTER_FIELDS: frozenset[tuple[str, str]] = frozenset({
    ("meta.ObjectMeta", "deletionGracePeriodSeconds"),
    ("meta.OwnerReference", "controller"), ("meta.OwnerReference", "blockOwnerDeletion"),
    ("core.ConfigMap", "immutable"), ("core.Secret", "immutable"),
    ("core.ServiceAccount", "automountServiceAccountToken"),
    ("core.PodSpec", "terminationGracePeriodSeconds"), ("core.PodSpec", "activeDeadlineSeconds"),
    ("core.PodSpec", "automountServiceAccountToken"), ("core.PodSpec", "shareProcessNamespace"),
    ("core.PodSpec", "priority"), ("core.PodSpec", "enableServiceLinks"), ("core.PodSpec", "setHostnameAsFQDN"),
    ("core.PodSpec", "hostUsers"),
    ("core.SecurityContext", "privileged"), ("core.SecurityContext", "runAsUser"),
    ("core.SecurityContext", "runAsGroup"), ("core.SecurityContext", "runAsNonRoot"),
    ("core.SecurityContext", "readOnlyRootFilesystem"), ("core.SecurityContext", "allowPrivilegeEscalation"),
    ("core.PodSecurityContext", "runAsUser"), ("core.PodSecurityContext", "runAsGroup"),
    ("core.PodSecurityContext", "runAsNonRoot"), ("core.PodSecurityContext", "fsGroup"),
    ("core.SecretVolumeSource", "defaultMode"), ("core.SecretVolumeSource", "optional"),
    ("core.ConfigMapVolumeSource", "defaultMode"), ("core.ConfigMapVolumeSource", "optional"),
    ("core.KeyToPath", "mode"), ("core.ConfigMapKeySelector", "optional"), ("core.SecretKeySelector", "optional"),
    ("core.ConfigMapEnvSource", "optional"), ("core.SecretEnvSource", "optional"),
    ("core.Probe", "terminationGracePeriodSeconds"),
    ("batch.JobSpec", "parallelism"), ("batch.JobSpec", "completions"), ("batch.JobSpec", "activeDeadlineSeconds"),
    ("batch.JobSpec", "backoffLimit"), ("batch.JobSpec", "backoffLimitPerIndex"), ("batch.JobSpec", "maxFailedIndexes"),
    ("batch.JobSpec", "ttlSecondsAfterFinished"), ("batch.JobSpec", "suspend"), ("batch.JobSpec", "manualSelector"),
    ("batch.JobStatus", "ready"), ("batch.JobStatus", "terminating"),
    ("coordination.LeaseSpec", "holderIdentity"), ("coordination.LeaseSpec", "leaseDurationSeconds"),
    ("coordination.LeaseSpec", "leaseTransitions"),
    ("core.ServiceSpec", "allocateLoadBalancerNodePorts"),
    ("authentication.TokenRequestSpec", "expirationSeconds"),
    ("autoscaling.HorizontalPodAutoscalerSpec", "minReplicas"), ("autoscaling.MetricTarget", "averageUtilization"),
    ("autoscaling.HPAScalingRules", "stabilizationWindowSeconds"), ("autoscaling.HPAScalingRules", "selectPolicy"),
    # not a pointer, but its JSON has no omitempty: 0 is sent and validated as such
    ("autoscaling.HorizontalPodAutoscalerSpec", "maxReplicas"),
})

_WIRE_VARINT, _WIRE_FIXED64, _WIRE_BYTES, _WIRE_FIXED32 = 0, 1, 2, 5
_NUMERIC_SCALARS = {"i", "?", "d", "f"}


def is_kubernetes_protobuf(body: bytes) -> bool:
    return body.startswith(MAGIC)


def supported_kinds() -> list[tuple[str, str]]:
    return sorted(KIND_MESSAGES)


def decode_kubernetes_protobuf(body: bytes) -> dict[str, Any]:
    """`k8s\\x00` + runtime.Unknown -> `{"apiVersion", "kind", ...object fields}`."""
    if not is_kubernetes_protobuf(body):
        raise ProtobufDecodeError("protobuf body: missing the k8s\\x00 magic prefix")
    envelope = decode_message(body[len(MAGIC):], "runtime.Unknown")
    type_meta = envelope.get("typeMeta") or {}
    api_version, kind = type_meta.get("apiVersion", ""), type_meta.get("kind", "")
    if envelope.get("contentEncoding"):
        raise ProtobufDecodeError(f"protobuf body: unsupported contentEncoding {envelope['contentEncoding']!r}")
    message = KIND_MESSAGES.get((api_version, kind))
    if message is None:
        raise ProtobufDecodeError(f"protobuf body: kind {kind!r} of apiVersion {api_version!r} cannot be decoded")
    raw = base64.b64decode(envelope.get("raw", ""))
    return {"apiVersion": api_version, "kind": kind, **decode_message(raw, message)}


@lru_cache(maxsize=None)
def _fields(message: str) -> dict[int, tuple[str, str]]:
    table = MESSAGES.get(message)
    if table is None:
        raise ProtobufDecodeError(f"protobuf: no field table for message {message}")
    fields = {}
    for entry in table.split(";"):
        if entry:
            number, name, type_code = entry.split(" ")
            fields[int(number)] = (name, type_code)
    return fields


def decode_message(data: bytes, message: str) -> dict[str, Any]:
    """Decode one message of the tables into its JSON form."""
    fields = _fields(message)
    result: dict[str, Any] = {}
    for number, wire_type, payload in _read_fields(data, message):
        known = fields.get(number)
        if known is None:
            continue  # a field added after our tables: skip it
        name, type_code = known
        try:
            _store(result, message, name, type_code, wire_type, payload)
        except (UnicodeDecodeError, ValueError, struct.error) as problem:
            raise ProtobufDecodeError(f"protobuf {message}.{name}: {problem}") from None
    return _drop_omitted_zeros(result, message, fields)


def _store(result: dict[str, Any], message: str, name: str, type_code: str, wire_type: int, payload: Any) -> None:
    if type_code.startswith("^"):
        inlined = _decode_value(type_code[1:], wire_type, payload, f"{message}.{name}")
        result.update(inlined)
    elif type_code.startswith("*"):
        element = type_code[1:]
        values = result.setdefault(name, [])
        if element in _NUMERIC_SCALARS and wire_type == _WIRE_BYTES:
            values.extend(_packed(element, payload))
        else:
            values.append(_decode_value(element, wire_type, payload, f"{message}.{name}"))
    elif type_code.startswith("{"):
        if wire_type != _WIRE_BYTES:  # a map entry is a message: its payload was a number
            raise ProtobufDecodeError(f"protobuf {message}.{name}: expected a map entry, got wire type {wire_type}")
        key_type, _, value_type = type_code[1:-1].partition(":")
        entry = _decode_map_entry(payload, key_type, value_type, f"{message}.{name}")
        result.setdefault(name, {})[entry[0]] = entry[1]
    else:
        result[name] = _decode_value(type_code, wire_type, payload, f"{message}.{name}")


def _decode_value(type_code: str, wire_type: int, payload: Any, where: str) -> Any:
    if type_code in _NUMERIC_SCALARS:
        return _scalar(type_code, wire_type, payload, where)
    if wire_type != _WIRE_BYTES:
        raise ProtobufDecodeError(f"protobuf {where}: expected a length-delimited field, got wire type {wire_type}")
    if type_code == "s":
        return payload.decode("utf-8")
    if type_code == "b":
        return base64.b64encode(payload).decode("ascii")
    special = _SPECIAL_DECODERS.get(type_code)
    if special is not None:
        return special(payload, where)
    return decode_message(payload, type_code)


def _scalar(type_code: str, wire_type: int, payload: Any, where: str) -> Any:
    if type_code in ("i", "?"):
        if wire_type != _WIRE_VARINT:
            raise ProtobufDecodeError(f"protobuf {where}: expected a varint, got wire type {wire_type}")
        return bool(payload) if type_code == "?" else _signed(payload)
    if type_code == "d":
        if wire_type != _WIRE_FIXED64:
            raise ProtobufDecodeError(f"protobuf {where}: expected a double, got wire type {wire_type}")
        return struct.unpack("<d", payload)[0]
    if wire_type != _WIRE_FIXED32:
        raise ProtobufDecodeError(f"protobuf {where}: expected a float, got wire type {wire_type}")
    return struct.unpack("<f", payload)[0]


def _packed(type_code: str, payload: bytes) -> list[Any]:
    values, position = [], 0
    while position < len(payload):
        if type_code in ("i", "?"):
            value, position = _read_varint(payload, position)
            values.append(bool(value) if type_code == "?" else _signed(value))
        else:
            size = 8 if type_code == "d" else 4
            values.append(struct.unpack("<d" if size == 8 else "<f", payload[position:position + size])[0])
            position += size
    return values


def _decode_map_entry(payload: bytes, key_type: str, value_type: str, where: str) -> tuple[Any, Any]:
    key: Any = "" if key_type in ("s", "b") else 0
    value: Any = None
    for number, wire_type, field_payload in _read_fields(payload, where):
        if number == 1:
            key = _decode_value(key_type, wire_type, field_payload, where)
        elif number == 2:
            value = _decode_value(value_type, wire_type, field_payload, where)
    if value is None:
        value = "" if value_type in ("s", "b", "Q") else ({} if "." in value_type else 0)
    return key, value


def _drop_omitted_zeros(result: dict[str, Any], message: str, fields: dict[int, tuple[str, str]]) -> dict[str, Any]:
    """What Go's JSON encoder leaves out: nulls, and zero scalars unless the Go field is a pointer."""
    scalar_fields = {name for name, code in fields.values() if code in ("s", "b", "i", "?", "d", "f")}

    def omitted(name: str, value: Any) -> bool:
        if value is None:
            return True
        return name in scalar_fields and (message, name) not in POINTER_FIELDS and value in ("", 0)

    return {name: value for name, value in result.items() if not omitted(name, value)}


# -- wire reading ----------------------------------------------------------------------------


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if position >= len(data):
            raise ProtobufDecodeError("protobuf: truncated varint")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
        if shift > 63:
            raise ProtobufDecodeError("protobuf: varint too long")


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _read_fields(data: bytes, where: str) -> list[tuple[int, int, Any]]:
    fields, position = [], 0
    while position < len(data):
        tag, position = _read_varint(data, position)
        number, wire_type = tag >> 3, tag & 0x7
        if number == 0:
            raise ProtobufDecodeError(f"protobuf {where}: invalid field number 0")
        if wire_type == _WIRE_VARINT:
            payload, position = _read_varint(data, position)
        elif wire_type == _WIRE_FIXED64:
            payload, position = data[position:position + 8], position + 8
        elif wire_type == _WIRE_FIXED32:
            payload, position = data[position:position + 4], position + 4
        elif wire_type == _WIRE_BYTES:
            size, position = _read_varint(data, position)
            payload, position = data[position:position + size], position + size
        else:
            raise ProtobufDecodeError(f"protobuf {where}: unsupported wire type {wire_type}")
        if position > len(data):
            raise ProtobufDecodeError(f"protobuf {where}: truncated field {number}")
        fields.append((number, wire_type, payload))
    return fields


# -- well-known Kubernetes types ---------------------------------------------------------------


def _time_parts(payload: bytes, where: str) -> tuple[int, int]:
    seconds, nanos = 0, 0
    for number, wire_type, value in _read_fields(payload, where):
        if number == 1 and wire_type == _WIRE_VARINT:
            seconds = _signed(value)
        elif number == 2 and wire_type == _WIRE_VARINT:
            nanos = _signed(value)
    return seconds, nanos


_ZERO_TIME_SECONDS = -62135596800  # 0001-01-01T00:00:00Z, Go's zero time


def _decode_time(payload: bytes, where: str) -> str | None:
    seconds, _ = _time_parts(payload, where)
    if not payload or seconds <= _ZERO_TIME_SECONDS:
        return None
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _decode_micro_time(payload: bytes, where: str) -> str | None:
    seconds, nanos = _time_parts(payload, where)
    if not payload or seconds <= _ZERO_TIME_SECONDS:
        return None
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{nanos // 1000:06d}Z"


def _decode_duration(payload: bytes, where: str) -> str:
    nanoseconds = 0
    for number, wire_type, value in _read_fields(payload, where):
        if number == 1 and wire_type == _WIRE_VARINT:
            nanoseconds = _signed(value)
    return _go_duration(nanoseconds)


def _go_duration(nanoseconds: int) -> str:
    """Go's time.Duration.String() for whole-second-or-larger values (`1h2m3s`, `1.5s`, `0s`)."""
    if nanoseconds == 0:
        return "0s"
    sign = "-" if nanoseconds < 0 else ""
    remaining = abs(nanoseconds)
    hours, remaining = divmod(remaining, 3_600_000_000_000)
    minutes, remaining = divmod(remaining, 60_000_000_000)
    seconds = remaining / 1_000_000_000
    text = f"{seconds:.9f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{text}"
    if minutes:
        return f"{sign}{minutes}m{text}"
    return sign + text


def _decode_quantity(payload: bytes, where: str) -> str:
    for number, wire_type, value in _read_fields(payload, where):
        if number == 1 and wire_type == _WIRE_BYTES:
            return value.decode("utf-8")
    return "0"


def _decode_int_or_string(payload: bytes, where: str) -> int | str:
    kind, int_value, str_value = 0, 0, ""
    for number, wire_type, value in _read_fields(payload, where):
        if number == 1 and wire_type == _WIRE_VARINT:
            kind = value
        elif number == 2 and wire_type == _WIRE_VARINT:
            int_value = _signed(value)
        elif number == 3 and wire_type == _WIRE_BYTES:
            str_value = value.decode("utf-8")
    return str_value if kind == 1 else int_value


def _decode_raw_json(payload: bytes, where: str) -> Any:
    raw = b""
    for number, wire_type, value in _read_fields(payload, where):
        if number == 1 and wire_type == _WIRE_BYTES:
            raw = value
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise ProtobufDecodeError(f"protobuf {where}: embedded raw value is not JSON") from None


_SPECIAL_DECODERS = {
    "T": _decode_time,
    "M": _decode_micro_time,
    "D": _decode_duration,
    "Q": _decode_quantity,
    "I": _decode_int_or_string,
    "R": _decode_raw_json,
    "F": _decode_raw_json,
}
