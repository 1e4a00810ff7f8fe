"""Keyed list upserts used by the plugins (spec §4.9).

Replace an item with the same key in place (whole item, not merged) or append it.
"""
from __future__ import annotations

from typing import Any, Callable

Item = dict[str, Any]


def _upsert(items: list[Item], item: Item, same: Callable[[Item, Item], bool]) -> None:
    for index, existing in enumerate(items):
        if same(existing, item):
            items[index] = item
            return
    items.append(item)


def upsert_env(env: list[Item], item: Item) -> None:
    _upsert(env, item, lambda a, b: a.get("name") == b.get("name"))


def upsert_volume(volumes: list[Item], item: Item) -> None:
    _upsert(volumes, item, lambda a, b: a.get("name") == b.get("name"))


def upsert_volume_mount(mounts: list[Item], item: Item) -> None:
    # Upstream keys volume mounts by mount path, not by name.
    _upsert(mounts, item, lambda a, b: a.get("mountPath") == b.get("mountPath"))


def upsert_port(ports: list[Item], item: Item) -> None:
    # Deliberate deviation (docs/compatibility.md): upstream also treats two *unnamed* ports
    # as equal, so adding port 29500 silently dropped a runtime's unnamed port 8080. We match
    # by containerPort, or by name only when both names are set.
    def same(a: Item, b: Item) -> bool:
        if a.get("containerPort") == b.get("containerPort"):
            return True
        return bool(a.get("name")) and a.get("name") == b.get("name")

    _upsert(ports, item, same)


def api_env_var(env: Item) -> Item:
    """Convert a TrainJob EnvVar into what upstream applies (spec §4.9).

    ``value`` is always carried unless ``valueFrom`` is present; from ``valueFrom`` only
    fieldRef.fieldPath, resourceFieldRef, configMapKeyRef and secretKeyRef survive.
    """
    out: Item = {"name": env.get("name")}
    value_from = env.get("valueFrom")
    if isinstance(value_from, dict) and value_from:
        carried: Item = {}
        field_ref = value_from.get("fieldRef")
        if isinstance(field_ref, dict):
            carried["fieldRef"] = {"fieldPath": field_ref.get("fieldPath")}
        for key, fields in (("resourceFieldRef", ("containerName", "resource", "divisor")),
                            ("configMapKeyRef", ("name", "key", "optional")),
                            ("secretKeyRef", ("name", "key", "optional"))):
            ref = value_from.get(key)
            if isinstance(ref, dict):
                carried[key] = {f: ref[f] for f in fields if f in ref}
        out["valueFrom"] = carried
    else:
        value = env.get("value", "")
        out["value"] = value if isinstance(value, str) else str(value)
    return out
