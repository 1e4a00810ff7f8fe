"""Validation of object names and labels, with the messages the real API server uses."""
from __future__ import annotations

import json
import re
from typing import Any

from trainyard.apimachinery.dns_names import (
    DNS1035_LABEL, DNS1035_LABEL_MAX_LENGTH, DNS1035_LABEL_MESSAGE, DNS1123_LABEL, DNS1123_LABEL_MAX_LENGTH,
    DNS1123_LABEL_MESSAGE, DNS1123_SUBDOMAIN, DNS1123_SUBDOMAIN_MAX_LENGTH, DNS1123_SUBDOMAIN_MESSAGE,
    is_dns1123_subdomain,
)

from ..errors import field_cause

_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _invalid(field: str, value: Any, message: str) -> dict[str, str]:
    return field_cause(field, "FieldValueInvalid", f"Invalid value: {json.dumps(value)}: {message}")


# The name rules kube-apiserver's kinds validate ``metadata.name`` with; each kind's strategy
# (apiserver/registry/strategies.py) names its rule.

def _pattern_errors(name: str, limit: int, pattern: re.Pattern[str], message: str) -> list[dict[str, str]]:
    errors = []
    if len(name) > limit:
        errors.append(_invalid("metadata.name", name, f"must be no more than {limit} characters"))
    if not pattern.match(name):
        errors.append(_invalid("metadata.name", name, message))
    return errors


def subdomain_name_errors(name: str) -> list[dict[str, str]]:
    """Most kinds: a DNS-1123 subdomain (253 characters)."""
    return _pattern_errors(name, DNS1123_SUBDOMAIN_MAX_LENGTH, DNS1123_SUBDOMAIN, DNS1123_SUBDOMAIN_MESSAGE)


def label_name_errors(name: str) -> list[dict[str, str]]:
    """Namespaces: a DNS-1123 label (63 characters)."""
    return _pattern_errors(name, DNS1123_LABEL_MAX_LENGTH, DNS1123_LABEL, DNS1123_LABEL_MESSAGE)


def dns1035_name_errors(name: str) -> list[dict[str, str]]:
    """Services: a DNS-1035 label (starts with a letter)."""
    return _pattern_errors(name, DNS1035_LABEL_MAX_LENGTH, DNS1035_LABEL, DNS1035_LABEL_MESSAGE)


def path_segment_name_errors(name: str) -> list[dict[str, str]]:
    """RBAC kinds: names are path segments (system:discovery, trainyard:planner), as
    kube-apiserver's ValidateRBACName: not "." or "..", no "/" or "%"."""
    if name in (".", ".."):
        return [_invalid("metadata.name", name, f"may not be '{name}'")]
    return [_invalid("metadata.name", name, f"may not contain '{c}'") for c in "/%" if c in name]


def event_name_errors(name: str) -> list[dict[str, str]]:
    """Events: names carry a dot-separated suffix; any path-safe name is accepted."""
    if "/" in name or name in (".", "..") or "%" in name:
        return [_invalid("metadata.name", name, "may not contain '/' or '%'")]
    return []


def label_errors(labels: Any, field: str = "metadata.labels") -> list[dict[str, str]]:
    if labels is None:
        return []
    if not isinstance(labels, dict):
        return [field_cause(field, "FieldValueTypeInvalid", "Invalid value: must be a map of strings")]
    errors = []
    for key, value in labels.items():
        errors.extend(qualified_name_errors(key, field))
        if not isinstance(value, str):
            errors.append(field_cause(f"{field}.{key}", "FieldValueTypeInvalid", "Invalid value: must be a string"))
            continue
        if len(value) > 63:
            errors.append(_invalid(field, value, "must be no more than 63 characters"))
        elif not _LABEL_VALUE.match(value):
            errors.append(_invalid(field, value, "a valid label must be an empty string or consist of alphanumeric "
                                   "characters, '-', '_' or '.', and must start and end with an alphanumeric character"))
    return errors


def qualified_name_errors(key: str, field: str) -> list[dict[str, str]]:
    prefix, _, name = key.rpartition("/")
    errors = []
    if "/" in key and (not prefix or not is_dns1123_subdomain(prefix)):
        errors.append(_invalid(field, key, "prefix part " + DNS1123_SUBDOMAIN_MESSAGE))
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        errors.append(_invalid(field, key, "name part must consist of alphanumeric characters, '-', '_' or '.', and "
                               "must start and end with an alphanumeric character (63 characters at most)"))
    return errors


def annotation_errors(annotations: Any) -> list[dict[str, str]]:
    if annotations is None:
        return []
    if not isinstance(annotations, dict) or not all(isinstance(v, str) for v in annotations.values()):
        return [field_cause("metadata.annotations", "FieldValueTypeInvalid", "Invalid value: must be a map of strings")]
    errors = []
    for key in annotations:
        errors.extend(qualified_name_errors(key, "metadata.annotations"))
    total = sum(len(k) + len(v) for k, v in annotations.items())
    if total > 256 * 1024:
        errors.append(field_cause("metadata.annotations", "FieldValueTooLong", "Too long: must have at most 262144 bytes"))
    return errors
